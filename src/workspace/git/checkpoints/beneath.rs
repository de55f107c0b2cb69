//! A workspace changed from a directory handle held open: every directory on the way is
//! opened by the handle of the one above it without following a symlink, so what an
//! agent does to the workspace meanwhile (a directory swapped for a symlink to elsewhere)
//! cannot lead a write or a removal out of it.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};

use crate::workspace::WorkspaceError;

/// Opening a directory: never through a symlink.
const DIR: OFlag = OFlag::O_DIRECTORY
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC)
    .union(OFlag::O_RDONLY);

/// Tries at one name before giving up on an agent that keeps putting things there.
const TRIES: usize = 4;

fn io(errno: Errno) -> WorkspaceError {
    WorkspaceError::from(std::io::Error::from(errno))
}

/// The workspace's directory, held open.
pub(super) struct Beneath {
    root: OwnedFd,
}

/// What stands at a name.
pub(super) enum Standing {
    Nothing,
    Symlink,
    /// A regular file; whether it is executable.
    File(bool),
    Other,
}

impl Beneath {
    pub(super) fn open(dir: &Path) -> Result<Beneath, WorkspaceError> {
        let root = nix::fcntl::open(dir, DIR, Mode::empty()).map_err(io)?;
        Ok(Beneath { root })
    }

    /// The directory `rel` beneath the workspace. With `make`, each component is made a
    /// real directory (whatever else stands there removed first); without, `None` when
    /// one is missing or is not a directory.
    pub(super) fn dir(&self, rel: &Path, make: bool) -> Result<Option<OwnedFd>, WorkspaceError> {
        let mut at = self.root.try_clone()?;
        for component in rel.components() {
            let name = component.as_os_str();
            let mut opened = None;
            for _ in 0..TRIES {
                match openat(&at, name, DIR, Mode::empty()) {
                    Ok(fd) => {
                        opened = Some(fd);
                        break;
                    }
                    Err(Errno::ENOENT) if make => {
                        match mkdirat(&at, name, Mode::from_bits_truncate(0o755)) {
                            Ok(()) | Err(Errno::EEXIST) => {}
                            Err(errno) => return Err(io(errno)),
                        }
                    }
                    Err(Errno::ENOTDIR | Errno::ELOOP) if make => remove_at(&at, name)?,
                    Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(None),
                    Err(errno) => return Err(io(errno)),
                }
            }
            at = opened.ok_or_else(|| {
                WorkspaceError::BadPath(format!("{} keeps changing", rel.display()))
            })?;
        }
        Ok(Some(at))
    }
}

/// What stands at `name` in `dir` (a symlink is not followed).
pub(super) fn standing(dir: &OwnedFd, name: &OsStr) -> Result<Standing, WorkspaceError> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => {
            let kind = SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits());
            Ok(if kind == SFlag::S_IFLNK {
                Standing::Symlink
            } else if kind == SFlag::S_IFREG {
                Standing::File(stat.st_mode & 0o111 != 0)
            } else {
                Standing::Other
            })
        }
        Err(Errno::ENOENT) => Ok(Standing::Nothing),
        Err(errno) => Err(io(errno)),
    }
}

/// Whether `name` in `dir` holds `content` (a symlink: points there), read without
/// following a symlink.
pub(super) fn holds(dir: &OwnedFd, name: &OsStr, symlink: bool, content: &[u8]) -> bool {
    if symlink {
        return readlinkat(dir, name).is_ok_and(|target| target.as_bytes() == content);
    }
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    let Ok(fd) = openat(dir, name, flags, Mode::empty()) else {
        return false;
    };
    let mut now = Vec::with_capacity(content.len());
    File::from(fd)
        .take(content.len() as u64 + 1)
        .read_to_end(&mut now)
        .is_ok_and(|_| now == content)
}

/// Removes `name` in `dir`, whatever it is: a directory with everything in it, never
/// following a symlink. Absent is fine.
pub(super) fn remove_at(dir: &OwnedFd, name: &OsStr) -> Result<(), WorkspaceError> {
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(Errno::EISDIR | Errno::EPERM) => {
            // A directory: the standard library's removal opens each level by the handle of
            // the one above without following a symlink; it starts from this directory's
            // own handle.
            let path = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
            match std::fs::remove_dir_all(&path) {
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => Ok(other?),
            }
        }
        Err(errno) => Err(io(errno)),
    }
}

/// Writes `name` in `dir` anew: a symlink to `content`, or a file holding it (`exec`: its
/// mode 0755, else 0644). Whatever stood there is removed first.
pub(super) fn write_at(
    dir: &OwnedFd,
    name: &OsStr,
    symlink: bool,
    exec: bool,
    content: &[u8],
) -> Result<(), WorkspaceError> {
    for _ in 0..TRIES {
        remove_at(dir, name)?;
        let made = if symlink {
            symlinkat(OsStr::from_bytes(content), dir, name).map(|()| None)
        } else {
            let flags = OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_EXCL
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC;
            let mode = Mode::from_bits_truncate(if exec { 0o755 } else { 0o644 });
            openat(dir, name, flags, mode).map(Some)
        };
        match made {
            Ok(None) => return Ok(()),
            Ok(Some(fd)) => {
                File::from(fd).write_all(content)?;
                return Ok(());
            }
            // Something was put there meanwhile: removed again.
            Err(Errno::EEXIST) => continue,
            Err(errno) => return Err(io(errno)),
        }
    }
    Err(WorkspaceError::BadPath(format!(
        "{} keeps changing",
        Path::new(name).display()
    )))
}
