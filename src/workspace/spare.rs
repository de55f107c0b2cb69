//! Spare workspaces: a thread's workspace made before its thread exists, for an agent
//! session made ahead (a spare), whose `cwd` must stay the thread's workspace for the
//! session's whole life (an agent such as Claude Code files its sessions by `cwd`, and a
//! confined process's Landlock rules name the directory it was started in).
//!
//! A spare workspace is made like any other, under a name no thread's segment can be,
//! beside the threads' own: `<principal_dir>/threads/_spare.<32 hex>` (a thread's segment
//! ends in `-` and 32 hex digits). The thread that takes it adopts it: a record file
//! `<principal_dir>/threads/<thread-dir>.at` holding the spare's name, written whole
//! (a temporary file renamed into place) and synced before the thread's session is used.
//! From then on the thread's workspace is that directory ([`Workspaces::resolve`]): after a
//! restart, for its routes, its fork and its removal. A record is read like a base file
//! (it lies where a confined agent of unit `thread` cannot write, and yields a spare's name
//! and nothing else).
//!
//! Spare workspaces no thread adopted are removed when their spare stops, and those an
//! earlier process left by [`Workspaces::sweep_spares`].

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{WorkspaceError, Workspaces, made_dir, part_path};

/// The prefix of a spare workspace's directory name.
const SPARE_PREFIX: &str = "_spare.";
/// The extension of a thread's adoption record.
const RECORD_EXTENSION: &str = ".at";

impl Workspaces {
    /// A fresh directory for a spare workspace of `principal` (not made yet: [`prepare`]
    /// makes it). Only for [`super::Unit::Thread`]: with one workspace per principal every
    /// thread's is already known.
    ///
    /// [`prepare`]: Workspaces::prepare
    pub fn spare_dir(&self, principal: &str) -> PathBuf {
        let name = format!("{SPARE_PREFIX}{}", uuid::Uuid::new_v4().simple());
        self.principal_dir(principal).join("threads").join(name)
    }

    /// Whether `dir` is a spare workspace's directory (by its name).
    pub fn is_spare(dir: &Path) -> bool {
        dir.file_name()
            .and_then(|name| name.to_str())
            .is_some_and(is_spare_name)
    }

    /// The workspace of `thread` of `principal`: the spare it adopted, else
    /// [`Workspaces::dir_for`]. Reads the thread's record (blocking); a record that is
    /// missing, unreadable or names no spare counts as none.
    pub fn resolve(&self, principal: &str, thread: &str) -> PathBuf {
        let own = self.dir_for(principal, thread);
        if self.config.unit != super::Unit::Thread {
            return own;
        }
        match read_record(&own) {
            Some(spare) => own.with_file_name(spare),
            None => own,
        }
    }

    /// Makes the spare workspace `spare` (made, of the same principal) the workspace of
    /// `thread`: its record is written and synced. Refused when the thread has a workspace
    /// already (made, or adopted).
    pub fn adopt(&self, principal: &str, thread: &str, spare: &Path) -> Result<(), WorkspaceError> {
        let own = self.dir_for(principal, thread);
        let name = spare.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !is_spare_name(name) || spare.parent() != own.parent() {
            return Err(WorkspaceError::BadPath(
                "not a spare workspace of this principal".to_owned(),
            ));
        }
        if !made_dir(spare)? {
            return Err(WorkspaceError::NotFound);
        }
        if made_dir(&own)? || read_record(&own).is_some() {
            return Err(WorkspaceError::BadPath(
                "the thread has a workspace already".to_owned(),
            ));
        }
        let record = record_path(&own).ok_or(WorkspaceError::NotFound)?;
        let part = part_path(&record, "part")?;
        let written = (|| {
            let mut file = fs::File::create(&part)?;
            file.write_all(name.as_bytes())?;
            file.sync_all()?;
            fs::rename(&part, &record)?;
            if let Some(parent) = record.parent() {
                fs::File::open(parent)?.sync_all()?;
            }
            Ok::<(), std::io::Error>(())
        })();
        if let Err(error) = written {
            let _ = fs::remove_file(&part);
            return Err(error.into());
        }
        Ok(())
    }

    /// Removes the workspace of `thread` of `principal` (the spare it adopted, and the
    /// record, or its own directory); absent is fine.
    pub fn remove_thread(&self, principal: &str, thread: &str) -> Result<(), WorkspaceError> {
        let own = self.dir_for(principal, thread);
        let dir = self.resolve(principal, thread);
        self.remove(&dir)?;
        if dir != own
            && let Some(record) = record_path(&own)
        {
            match fs::remove_file(record) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    /// Removes every spare workspace of this agent that no thread adopted (what an earlier
    /// process left when it stopped without removing its spares); returns how many. Only
    /// for a moment when this process has made no spare yet.
    pub fn sweep_spares(&self) -> usize {
        let agent_dir = match self.principal_dir("").parent() {
            Some(dir) => dir.to_owned(),
            None => return 0,
        };
        let Ok(principals) = fs::read_dir(&agent_dir) else {
            return 0;
        };
        let mut removed = 0;
        for principal in principals.flatten() {
            let threads = principal.path().join("threads");
            let Ok(entries) = fs::read_dir(&threads) else {
                continue;
            };
            let names: Vec<String> = entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .collect();
            let adopted: Vec<String> = names
                .iter()
                .filter(|n| n.ends_with(RECORD_EXTENSION))
                .filter_map(|n| read_record(&threads.join(n.trim_end_matches(RECORD_EXTENSION))))
                .collect();
            for name in names.iter().filter(|n| is_spare_name(n)) {
                if adopted.contains(name) {
                    continue;
                }
                match self.remove(&threads.join(name)) {
                    Ok(()) => removed += 1,
                    Err(error) => {
                        tracing::warn!(%error, "cannot remove a spare workspace left by an earlier process")
                    }
                }
            }
        }
        removed
    }
}

/// Whether `name` is a spare workspace's: the prefix and 32 lowercase hex digits.
fn is_spare_name(name: &str) -> bool {
    name.strip_prefix(SPARE_PREFIX).is_some_and(|token| {
        token.len() == 32
            && token
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// The record beside a thread's own workspace path `own`: `<own>.at`.
fn record_path(own: &Path) -> Option<PathBuf> {
    let mut name = own.file_name()?.to_os_string();
    name.push(RECORD_EXTENSION);
    Some(own.with_file_name(name))
}

/// The spare a thread adopted, from its record beside `own` (`None`: no record, or one
/// that names no spare).
fn read_record(own: &Path) -> Option<String> {
    let record = record_path(own)?;
    // A record is a name: anything longer is not one.
    let meta = fs::symlink_metadata(&record).ok()?;
    if !meta.is_file() || meta.len() > 64 {
        return None;
    }
    let text = fs::read_to_string(&record).ok()?;
    is_spare_name(&text).then_some(text)
}
