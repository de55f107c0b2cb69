//! The files of a workspace: resolving and opening beneath its root, walking without
//! following symlinks, listing, reading, measuring, copying and removing.

use std::ffi::OsString;
use std::fs::{self, File, Metadata, OpenOptions, Permissions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;

use super::WorkspaceError;

/// Entries [`usage`] walks before giving up with `TooManyEntries`.
const USAGE_ENTRIES: usize = 1_000_000;
/// Entries a copy, a snapshot or a comparison walks.
pub(super) const TREE_ENTRIES: usize = 200_000;
/// Entries [`list`] returns at most.
const LIST_ENTRIES: usize = 100_000;
/// The largest file whose lines are counted.
pub(super) const TEXT_FILE_CAP: u64 = 256 * 1024;
/// The most text read (and, in a snapshot, kept) for counting lines in one pass.
pub(super) const TEXT_TOTAL_CAP: u64 = 16 * 1024 * 1024;

/// What a directory entry is (not following symlinks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One entry of [`list`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Entry {
    pub name: String,
    pub kind: EntryKind,
    /// A regular file's length; 0 for anything else.
    pub size: u64,
}

/// Bytes used by a workspace: the lengths of its regular files, or what the disk holds of
/// one where that is more (space reserved past its end, `fallocate --keep-size`), beyond
/// [`ALLOCATION_SLACK`]; symlinks not followed (a file with several links counts each
/// time). At most 1,000,000 entries are walked; past them the answer is
/// [`WorkspaceError::TooManyEntries`], not a partial sum.
pub fn usage(dir: &Path) -> Result<u64, WorkspaceError> {
    use std::os::unix::fs::MetadataExt;
    let tree = Tree::workspace(dir)?;
    let mut total = 0u64;
    tree.walk(USAGE_ENTRIES, false, |_, meta| {
        if meta.is_file() {
            let allocated = meta.blocks().saturating_mul(512);
            let counted = meta.len().max(allocated.saturating_sub(ALLOCATION_SLACK));
            total = total.saturating_add(counted);
        }
        Ok(())
    })?;
    Ok(total)
}

/// What a file may hold on disk past its length without counting (block rounding, a
/// file system's preallocation).
const ALLOCATION_SLACK: u64 = 64 * 1024;

/// The entries of directory `rel` of the workspace (`""` or `"."` is its root), sorted by
/// name; over 100,000 entries is `TooManyEntries`. `rel` is refused (`BadPath`) when
/// absolute, with a `..` component or a NUL, or when it resolves outside the workspace
/// through a symlink; a symlink staying inside is followed. Not a directory is `BadPath`.
pub fn list(dir: &Path, rel: &str) -> Result<Vec<Entry>, WorkspaceError> {
    let (tree, target) = Tree::resolve(dir, rel)?;
    let meta = fs::symlink_metadata(&target).map_err(not_found)?;
    if !meta.is_dir() {
        return Err(bad_path("not a directory"));
    }
    let mut entries: Vec<Entry> = tree
        .entries(&target, LIST_ENTRIES)?
        .into_iter()
        .map(|(name, meta)| Entry {
            name: name.to_string_lossy().into_owned(),
            kind: kind_of(&meta),
            size: if meta.is_file() { meta.len() } else { 0 },
        })
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// The content of file `rel` (refused as [`list`] refuses paths), `TooLarge` over `cap`
/// bytes. A directory, or anything else not a regular file, is `BadPath`.
pub fn read(dir: &Path, rel: &str, cap: u64) -> Result<Vec<u8>, WorkspaceError> {
    let (tree, target) = Tree::resolve(dir, rel)?;
    let meta = fs::symlink_metadata(&target).map_err(not_found)?;
    if meta.is_dir() {
        return Err(bad_path("a directory, not a file"));
    }
    if !meta.is_file() {
        return Err(bad_path("not a regular file"));
    }
    let file = tree.open(&target, false)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(bad_path("not a regular file"));
    }
    if meta.len() > cap {
        return Err(WorkspaceError::TooLarge {
            size: meta.len(),
            cap,
        });
    }
    let mut out = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(cap.saturating_add(1)).read_to_end(&mut out)?;
    let size = out.len() as u64;
    if size > cap {
        return Err(WorkspaceError::TooLarge { size, cap });
    }
    Ok(out)
}

/// A directory tree, by its canonical root; everything opened is checked to stay beneath.
pub(super) struct Tree {
    root: PathBuf,
}

impl Tree {
    /// A workspace: neither it nor its parent may be a symlink (the agent can write there).
    pub(super) fn workspace(dir: &Path) -> Result<Tree, WorkspaceError> {
        let meta = fs::symlink_metadata(dir).map_err(not_found)?;
        if meta.file_type().is_symlink() {
            return Err(bad_path("the workspace directory is a symlink"));
        }
        if !meta.is_dir() {
            return Err(bad_path("the workspace is not a directory"));
        }
        super::refuse_symlinked_parent(dir)?;
        Ok(Tree {
            root: fs::canonicalize(dir)?,
        })
    }

    /// A template, the operator's: symlinks on the way to it are followed.
    pub(super) fn template(dir: &Path) -> Result<Tree, WorkspaceError> {
        let root = fs::canonicalize(dir).map_err(|err| {
            io::Error::new(err.kind(), format!("template {}: {err}", dir.display()))
        })?;
        if !root.is_dir() {
            return Err(bad_path("the template is not a directory"));
        }
        Ok(Tree { root })
    }

    /// The workspace of `dir` and the canonical path of `rel` inside it.
    fn resolve(dir: &Path, rel: &str) -> Result<(Tree, PathBuf), WorkspaceError> {
        let rel = checked_relative(rel)?;
        let tree = Tree::workspace(dir)?;
        if rel.as_os_str().is_empty() {
            let root = tree.root.clone();
            return Ok((tree, root));
        }
        let target = fs::canonicalize(tree.root.join(&rel)).map_err(not_found)?;
        if !target.starts_with(&tree.root) {
            return Err(bad_path(
                "the path leads outside the workspace through a symlink",
            ));
        }
        Ok((tree, target))
    }

    pub(super) fn path(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    /// Opens `path` (beneath the root) for reading without following a final symlink or
    /// blocking on a FIFO, and checks through `/proc` where the descriptor really points.
    pub(super) fn open(&self, path: &Path, directory: bool) -> Result<File, WorkspaceError> {
        let mut flags = OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
        if directory {
            flags |= OFlag::O_DIRECTORY;
        }
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(flags.bits())
            .open(path)
            .map_err(|err| match err.raw_os_error() {
                Some(code) if code == Errno::ELOOP as i32 => {
                    bad_path("a symlink appeared where a file was")
                }
                _ => not_found(err),
            })?;
        if let Ok(real) = fs::read_link(fd_path(&file))
            && !real.starts_with(&self.root)
        {
            return Err(bad_path("the path leads outside the workspace"));
        }
        Ok(file)
    }

    /// The entries of directory `dir` (beneath the root) with their metadata, not following
    /// symlinks; more than `cap` is `TooManyEntries`.
    fn entries(&self, dir: &Path, cap: usize) -> Result<Vec<(OsString, Metadata)>, WorkspaceError> {
        let handle = self.open(dir, true)?;
        let through_fd = fd_path(&handle);
        let listing = if through_fd.is_dir() {
            fs::read_dir(&through_fd)
        } else {
            fs::read_dir(dir)
        }
        .map_err(not_found)?;
        let mut out = Vec::new();
        for entry in listing {
            let entry = entry?;
            if out.len() == cap {
                return Err(WorkspaceError::TooManyEntries { cap: cap as u64 });
            }
            match entry.metadata() {
                Ok(meta) => out.push((entry.file_name(), meta)),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(out)
    }

    /// Visits every entry under the root, parents before children, with its path relative
    /// to the root; `skip_git` leaves out a `.git` at the top. Directories that vanish
    /// meanwhile are skipped. More than `cap` entries is `TooManyEntries`.
    pub(super) fn walk(
        &self,
        cap: usize,
        skip_git: bool,
        mut visit: impl FnMut(&Path, &Metadata) -> Result<(), WorkspaceError>,
    ) -> Result<(), WorkspaceError> {
        let mut stack = vec![PathBuf::new()];
        let mut left = cap;
        while let Some(rel) = stack.pop() {
            let entries = match self.entries(&self.path(&rel), left) {
                Ok(entries) => entries,
                Err(WorkspaceError::NotFound) if !rel.as_os_str().is_empty() => continue,
                Err(WorkspaceError::TooManyEntries { .. }) => {
                    return Err(WorkspaceError::TooManyEntries { cap: cap as u64 });
                }
                Err(err) => return Err(err),
            };
            left -= entries.len();
            let top = rel.as_os_str().is_empty();
            for (name, meta) in entries {
                if skip_git && top && name == ".git" {
                    continue;
                }
                let child = rel.join(&name);
                visit(&child, &meta)?;
                if meta.is_dir() {
                    stack.push(child);
                }
            }
        }
        Ok(())
    }

    /// The text of file `rel` of length `len`, if it is text within the caps; what is read
    /// is taken from `budget`.
    pub(super) fn content(&self, rel: &Path, len: u64, budget: &mut u64) -> Content {
        if len > TEXT_FILE_CAP || len > *budget {
            return Content::Unknown;
        }
        let Ok(file) = self.open(&self.path(rel), false) else {
            return Content::Unknown;
        };
        let mut bytes = Vec::new();
        if file
            .take(TEXT_FILE_CAP + 1)
            .read_to_end(&mut bytes)
            .is_err()
        {
            return Content::Unknown;
        }
        let read = bytes.len() as u64;
        if read > TEXT_FILE_CAP || read > *budget {
            return Content::Unknown;
        }
        *budget -= read;
        match String::from_utf8(bytes) {
            Ok(text) if !text.contains('\0') => Content::Text(text),
            _ => Content::Binary,
        }
    }
}

/// What is known of a file's text.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Content {
    Text(String),
    Binary,
    /// Too large, past the budget, or unreadable.
    Unknown,
}

impl Content {
    /// Its line count; a binary file has none.
    pub(super) fn lines(&self) -> Option<u64> {
        match self {
            Content::Text(text) => Some(line_count(text)),
            Content::Binary => Some(0),
            Content::Unknown => None,
        }
    }

    pub(super) fn text(&self) -> Option<&str> {
        match self {
            Content::Text(text) => Some(text),
            _ => None,
        }
    }
}

/// Lines as a line diff counts them: a last line without a newline is one.
pub(super) fn line_count(text: &str) -> u64 {
    text.lines().count() as u64
}

/// Copies the tree `src` into the existing directory `dst`: regular files with their
/// permission bits and mtime, directories (kept writable by their owner), symlinks as
/// symlinks; special files are left out. `skip_git` leaves out a `.git` at the top.
pub(super) fn copy_tree(src: &Tree, dst: &Path, skip_git: bool) -> Result<(), WorkspaceError> {
    let mut dirs = Vec::new();
    src.walk(TREE_ENTRIES, skip_git, |rel, meta| {
        let to = dst.join(rel);
        let kind = meta.file_type();
        if kind.is_dir() {
            fs::create_dir(&to)?;
            dirs.push((to, meta.permissions().mode()));
        } else if kind.is_file() {
            copy_file(src, rel, meta, &to)?;
        } else if kind.is_symlink() {
            match fs::read_link(src.path(rel)) {
                Ok(target) => std::os::unix::fs::symlink(target, &to)?,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(())
    })?;
    // Last, so that a read-only directory could be filled first.
    for (dir, mode) in dirs.iter().rev() {
        fs::set_permissions(dir, Permissions::from_mode((mode & 0o777) | 0o700))?;
    }
    Ok(())
}

fn copy_file(src: &Tree, rel: &Path, meta: &Metadata, to: &Path) -> Result<(), WorkspaceError> {
    let mut from = match src.open(&src.path(rel), false) {
        Ok(file) => file,
        // Gone since it was listed.
        Err(WorkspaceError::NotFound) => return Ok(()),
        Err(err) => return Err(err),
    };
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    io::copy(&mut from, &mut out)?;
    out.set_permissions(Permissions::from_mode(meta.permissions().mode() & 0o777))?;
    if let Ok(modified) = meta.modified() {
        out.set_modified(modified)?;
    }
    Ok(())
}

/// Removes a file, symlink or tree; absent is fine. Directories the owner cannot write
/// (as some tools leave them) are made writable first.
pub(super) fn remove_tree(path: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    if !meta.is_dir() {
        return fs::remove_file(path);
    }
    let removed = match fs::remove_dir_all(path) {
        Err(err) if err.kind() == io::ErrorKind::PermissionDenied => {
            make_writable(path);
            fs::remove_dir_all(path)
        }
        other => other,
    };
    match removed {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn make_writable(dir: &Path) {
    let mut stack = vec![dir.to_path_buf()];
    let mut left = TREE_ENTRIES;
    while let Some(dir) = stack.pop() {
        let _ = fs::set_permissions(&dir, Permissions::from_mode(0o700));
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten().take(left) {
            left -= 1;
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
}

fn checked_relative(rel: &str) -> Result<PathBuf, WorkspaceError> {
    if rel.contains('\0') {
        return Err(bad_path("the path contains a NUL byte"));
    }
    let mut clean = PathBuf::new();
    for component in Path::new(rel).components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(bad_path("the path has a `..` component")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(bad_path("the path is absolute"));
            }
        }
    }
    Ok(clean)
}

fn kind_of(meta: &Metadata) -> EntryKind {
    let kind = meta.file_type();
    if kind.is_file() {
        EntryKind::File
    } else if kind.is_dir() {
        EntryKind::Dir
    } else if kind.is_symlink() {
        EntryKind::Symlink
    } else {
        EntryKind::Other
    }
}

/// `/proc/self/fd/<fd>`: the open file itself, whatever its path has become.
fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

pub(super) fn not_found(err: io::Error) -> WorkspaceError {
    match err.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => WorkspaceError::NotFound,
        _ => WorkspaceError::Io(err),
    }
}

pub(super) fn bad_path(why: &str) -> WorkspaceError {
    WorkspaceError::BadPath(why.to_owned())
}
