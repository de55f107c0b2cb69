//! The command-line settings that keep git from running a program a repository's config
//! names, and the repository's common directory, found without running git in it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{bare_git, run};
use crate::workspace::WorkspaceError;

/// Settings that would run a program, each set on the command line to run none.
const NEUTRAL: [&str; 17] = [
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "core.editor=false",
    "sequence.editor=false",
    "core.askPass=false",
    "core.sshCommand=false",
    "core.gitProxy=",
    "core.attributesFile=/dev/null",
    "credential.helper=",
    "diff.external=",
    "gc.auto=0",
    "maintenance.auto=false",
    "submodule.recurse=false",
    "fetch.recurseSubmodules=false",
    "protocol.allow=never",
    "uploadpack.packObjectsHook=",
];

/// The command-line settings that keep every git command on one repository from running a
/// program its config names ([`NEUTRAL`] and its filter drivers emptied), read from the
/// repository's config files as they are now; or why the repository is refused.
#[derive(Debug, Clone, Default)]
pub(in crate::workspace) struct Neutral {
    settings: Vec<String>,
    /// The repository's common directory, given to git explicitly.
    common: PathBuf,
}

impl Neutral {
    /// Reads `repo`'s config files (the common one, and every `config.worktree`) without
    /// following includes: an include is refused, a filter driver emptied.
    pub(in crate::workspace) fn of(repo: &Path) -> Result<Neutral, WorkspaceError> {
        let mut settings: Vec<String> = NEUTRAL.iter().map(|s| (*s).to_owned()).collect();
        let common = common_dir(repo)?;
        let mut files = vec![common.join("config"), common.join("config.worktree")];
        for entry in fs::read_dir(common.join("worktrees"))
            .into_iter()
            .flatten()
            .flatten()
        {
            files.push(entry.path().join("config.worktree"));
        }
        let mut drivers = std::collections::BTreeSet::new();
        for file in files.iter().filter(|f| f.is_file()) {
            for key in config_keys(file)? {
                let lower = key.to_ascii_lowercase();
                if lower.starts_with("include.") || lower.starts_with("includeif.") {
                    return Err(WorkspaceError::Git(format!(
                        "the repository's config includes another file ({key} in {}); git is not run on it",
                        file.display()
                    )));
                }
                if let Some(rest) = lower.strip_prefix("filter.")
                    && let Some((_, var)) = rest.rsplit_once('.')
                {
                    // The driver's name as written (subsections keep their case).
                    let name = &key["filter.".len()..key.len() - var.len() - 1];
                    if name.contains(['=', '\n', '\0']) {
                        return Err(WorkspaceError::Git(format!(
                            "the repository's config names a filter driver git cannot be told to ignore ({})",
                            file.display()
                        )));
                    }
                    drivers.insert(name.to_owned());
                }
            }
        }
        for name in drivers {
            for (var, value) in [
                ("clean", ""),
                ("smudge", ""),
                ("process", ""),
                ("required", "false"),
            ] {
                settings.push(format!("filter.{name}.{var}={value}"));
            }
        }
        Ok(Neutral { settings, common })
    }

    /// The repository's common directory.
    pub(super) fn common(&self) -> &Path {
        &self.common
    }

    /// The settings, and the common directory named outright (`GIT_COMMON_DIR` outranks a
    /// `commondir` file an agent could write in a worktree's record).
    pub(super) fn apply(&self, cmd: &mut Command) {
        cmd.env("GIT_COMMON_DIR", &self.common);
        for setting in &self.settings {
            cmd.arg("-c").arg(setting);
        }
    }
}

/// The keys set in the config file `file`, includes not followed.
fn config_keys(file: &Path) -> Result<Vec<String>, WorkspaceError> {
    let mut cmd = bare_git();
    cmd.args(["config", "--no-includes", "--name-only", "--list", "--file"])
        .arg(file);
    let out = run(&mut cmd, "reading the repository's config")?;
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// The repository's common directory: `repo/.git` for one with a worktree, else `repo`
/// (bare). Found without running git in it, and refused when it would send git elsewhere:
/// a `.git` that is a file or a link (`gitdir: ...`), or a `commondir` file.
fn common_dir(repo: &Path) -> Result<PathBuf, WorkspaceError> {
    let refuse = |why: &str| {
        Err(WorkspaceError::Git(format!(
            "{}: {why}; git is not run on it",
            repo.display()
        )))
    };
    let dot_git = repo.join(".git");
    let common = match fs::symlink_metadata(&dot_git) {
        Ok(meta) if meta.is_dir() => dot_git,
        Ok(_) => return refuse("its .git is not a directory"),
        Err(err) if err.kind() == io::ErrorKind::NotFound => repo.to_owned(),
        Err(err) => return Err(err.into()),
    };
    if !common.join("objects").is_dir() {
        return refuse("it is not a git repository");
    }
    if fs::symlink_metadata(common.join("commondir")).is_ok() {
        return refuse("its git directory names another one (commondir)");
    }
    Ok(common)
}

/// What an agent that may write the repository must not change of it: its config, hooks
/// and `info` (attributes, excludes), and the `HEAD` new worktrees start from. Those that
/// exist.
pub fn protected_paths(repo: &Path) -> Vec<PathBuf> {
    let Ok(common) = common_dir(repo) else {
        return Vec::new();
    };
    ["config", "hooks", "info", "HEAD"]
        .iter()
        .map(|name| common.join(name))
        .filter(|path| fs::symlink_metadata(path).is_ok())
        .collect()
}
