//! Git sources: worktrees, their branches and base commits, forks, removal and changes.

use std::process::Command;

use super::*;

/// Runs git in `dir`, failing the test when git is missing or the command fails.
fn git_in(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t", "-C"])
        .arg(dir)
        .args(args)
        .output()
        .expect("git must be installed to run these tests");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A repository with `a.txt` (3 lines) and `b.txt` (1 line) in one commit.
fn repo(scratch: &Scratch) -> PathBuf {
    let repo = scratch.path("repo");
    fs::create_dir_all(&repo).expect("repo dir");
    git_in(&repo, &["init", "-q"]);
    write(&repo.join("a.txt"), "one\ntwo\nthree\n");
    write(&repo.join("b.txt"), "bee\n");
    git_in(&repo, &["add", "."]);
    git_in(&repo, &["commit", "-q", "-m", "init"]);
    repo
}

#[test]
fn git_prepare_fork_and_remove_manage_worktrees_and_branches() {
    let scratch = Scratch::new("git");
    let repo = repo(&scratch);
    let head = git_in(&repo, &["rev-parse", "HEAD"]);
    let source = Source::Git {
        repo: repo.clone(),
        reference: None,
    };
    let ws = workspaces(&scratch.path("root"), source, Unit::Thread);
    let from = ws.dir_for("alice", "t1");
    ws.prepare(&from).expect("prepare");
    assert_eq!(
        fs::read_to_string(from.join("a.txt")).expect("checked out"),
        "one\ntwo\nthree\n"
    );
    let base = fs::read_to_string(git::base_path(&from).expect("base path")).expect("base");
    assert_eq!(base.trim(), head);
    assert!(!from.join(".base").exists() && !from.join("base").exists());
    write(&from.join("a.txt"), "one\nTWO\nthree\n");
    write(&from.join("new.txt"), "untracked\n");
    ws.prepare(&from).expect("idempotent");
    assert_eq!(
        fs::read_to_string(from.join("a.txt")).expect("kept"),
        "one\nTWO\nthree\n"
    );

    let to = ws.dir_for("alice", "t2");
    ws.fork(&from, &to).expect("fork");
    assert_eq!(
        fs::read_to_string(to.join("a.txt")).expect("copied"),
        "one\nTWO\nthree\n"
    );
    assert_eq!(
        fs::read_to_string(to.join("new.txt")).expect("copied"),
        "untracked\n"
    );
    assert_eq!(git_in(&to, &["rev-parse", "HEAD"]), head);
    let branches = git_in(&repo, &["branch", "--list", "agui/*"]);
    assert_eq!(branches.lines().count(), 2, "{branches}");
    let worktrees = git_in(&repo, &["worktree", "list", "--porcelain"]);
    assert!(worktrees.contains(&to.display().to_string()), "{worktrees}");
    let status = git_in(&to, &["status", "--porcelain"]);
    assert!(
        status.contains("a.txt") && status.contains("new.txt"),
        "{status}"
    );

    for dir in [&from, &to] {
        ws.remove(dir).expect("remove");
        assert!(!dir.exists());
        assert!(!git::base_path(dir).expect("base path").exists());
        ws.remove(dir).expect("absent is fine");
    }
    let worktrees = git_in(&repo, &["worktree", "list", "--porcelain"]);
    assert_eq!(worktrees.matches("worktree ").count(), 1, "{worktrees}");
    assert_eq!(git_in(&repo, &["branch", "--list", "agui/*"]), "");
}

#[test]
fn git_prepare_checks_out_a_ref_and_redoes_a_half_made_worktree() {
    let scratch = Scratch::new("gitref");
    let repo = repo(&scratch);
    let first = git_in(&repo, &["rev-parse", "HEAD"]);
    write(&repo.join("a.txt"), "later\n");
    git_in(&repo, &["commit", "-q", "-am", "second"]);
    let source = Source::Git {
        repo: repo.clone(),
        reference: Some(first.clone()),
    };
    let ws = workspaces(&scratch.path("root"), source, Unit::Principal);
    let dir = ws.dir_for("alice", "t1");
    ws.prepare(&dir).expect("prepare");
    assert_eq!(
        fs::read_to_string(dir.join("a.txt")).expect("file"),
        "one\ntwo\nthree\n"
    );
    // A crash before the base file was written leaves a worktree that is not made.
    fs::remove_file(git::base_path(&dir).expect("base path")).expect("drop base");
    write(&dir.join("half.txt"), "x");
    ws.prepare(&dir).expect("made again");
    assert!(!dir.join("half.txt").exists());
    assert_eq!(git_in(&dir, &["rev-parse", "HEAD"]), first);
    let missing = Source::Git {
        repo,
        reference: Some("no-such-ref".to_owned()),
    };
    let ws = workspaces(&scratch.path("root2"), missing, Unit::Thread);
    assert!(matches!(
        ws.prepare(&ws.dir_for("a", "b")),
        Err(WorkspaceError::Git(_))
    ));
}

#[test]
fn git_changes_count_lines_list_untracked_files_and_cap_the_diff() {
    let scratch = Scratch::new("gitchanges");
    let repo = repo(&scratch);
    let source = Source::Git {
        repo,
        reference: None,
    };
    let ws = workspaces(&scratch.path("root"), source, Unit::Thread);
    let dir = ws.dir_for("alice", "t1");
    ws.prepare(&dir).expect("prepare");
    write(&dir.join("a.txt"), "one\nTWO\nthree\n");
    fs::remove_file(dir.join("b.txt")).expect("delete");
    write(&dir.join("c.txt"), "new\nlines\n");
    // Committing in the worktree does not move the base.
    git_in(&dir, &["add", "c.txt"]);
    git_in(&dir, &["commit", "-q", "-m", "agent"]);
    write(&dir.join("d.txt"), "untracked\n");
    let changes = ws.changes(&dir, 1 << 20).expect("changes");
    assert_eq!(changes.base, "git");
    let files = rows(&changes);
    assert_eq!(
        files,
        [
            ("a.txt", "modified", 14, Some(1), Some(1)),
            ("b.txt", "deleted", 4, Some(0), Some(1)),
            ("c.txt", "added", 10, Some(2), Some(0)),
            ("d.txt", "added", 10, Some(1), Some(0)),
        ]
    );
    let diff = changes.diff.expect("diff");
    assert!(diff.contains("+TWO") && diff.contains("-bee") && diff.contains("+untracked"));
    assert!(!changes.truncated);
    let cut = ws.changes(&dir, 20).expect("changes");
    assert!(cut.truncated);
    assert_eq!(cut.diff.expect("diff").len(), 20);
    assert_eq!(cut.files.len(), 4);
}

/// Every hook git knows of.
const HOOKS: [&str; 29] = [
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "sendemail-validate",
    "fsmonitor-watchman",
    "p4-changelist",
    "p4-prepare-changelist",
    "p4-post-changelist",
    "p4-pre-submit",
    "post-index-change",
    "pre-checkout",
];

/// A script that leaves `marks/<name>` when run, and passes its input through (a filter).
fn planted(dir: &Path, marks: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    write(
        &path,
        &format!("#!/bin/sh\ntouch '{}/{name}'\ncat\n", marks.display()),
    );
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Plants, as an agent with the repository writable could, every hook and every config
/// setting that makes git run a program; returns the directory the programs mark.
fn plant_everything(scratch: &Scratch, repo: &Path) -> PathBuf {
    let marks = scratch.path("marks");
    fs::create_dir_all(&marks).expect("marks");
    // Attributes that route every file through a driver, committed and in `info/`.
    write(
        &repo.join(".gitattributes"),
        "* filter=evil diff=evil merge=evil\n",
    );
    git_in(repo, &["add", ".gitattributes"]);
    git_in(repo, &["commit", "-q", "-m", "attributes"]);
    write(
        &repo.join(".git/info/attributes"),
        "* filter=evil diff=evil merge=evil\n",
    );
    let hooks = repo.join(".git/hooks");
    let elsewhere = scratch.path("elsewhere-hooks");
    fs::create_dir_all(&elsewhere).expect("hooks dir");
    for hook in HOOKS {
        planted(&hooks, &marks, hook);
        planted(&elsewhere, &marks, hook);
    }
    let bin = scratch.path("bin");
    let program = |name: &str| planted(&bin, &marks, name).display().to_string();
    let settings = [
        ("core.hooksPath", elsewhere.display().to_string()),
        ("core.fsmonitor", program("fsmonitor")),
        ("core.pager", program("pager")),
        ("core.editor", program("editor")),
        ("sequence.editor", program("sequence-editor")),
        ("core.askPass", program("askpass")),
        ("core.sshCommand", program("ssh")),
        ("core.gitProxy", program("proxy")),
        ("core.alternateRefsCommand", program("alternate-refs")),
        ("credential.helper", format!("!{}", program("credential"))),
        ("diff.external", program("diff-external")),
        ("diff.evil.textconv", program("textconv")),
        ("diff.evil.command", program("diff-command")),
        ("merge.evil.driver", program("merge-driver")),
        ("filter.evil.clean", program("clean")),
        ("filter.evil.smudge", program("smudge")),
        ("filter.evil.process", program("process")),
        ("filter.evil.required", "true".to_owned()),
        ("filter.Other.Name.smudge", program("smudge-dotted")),
        ("uploadpack.packObjectsHook", program("pack-objects")),
        ("gc.auto", "1".to_owned()),
        ("gc.autoDetach", "false".to_owned()),
        ("submodule.recurse", "true".to_owned()),
        ("safe.directory", "*".to_owned()),
        ("core.untrackedCache", "true".to_owned()),
    ];
    for (key, value) in settings {
        git_in(repo, &["config", key, &value]);
    }
    marks
}

fn marks_left(marks: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(marks)
        .expect("marks")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn git_runs_no_program_an_agent_planted_in_the_repository() {
    let scratch = Scratch::new("git-planted");
    let repo = repo(&scratch);
    let marks = plant_everything(&scratch, &repo);
    let source = Source::Git {
        repo: repo.clone(),
        reference: None,
    };
    let ws = workspaces(&scratch.path("root"), source, Unit::Thread);
    let from = ws.dir_for("alice", "t1");
    ws.prepare(&from).expect("prepare");
    write(&from.join("a.txt"), "one\nTWO\nthree\n");
    write(&from.join("new.txt"), "untracked\n");
    let changes = ws.changes(&from, 1 << 20).expect("changes");
    assert!(
        changes.files.iter().any(|f| f.path == "a.txt"),
        "{changes:?}"
    );
    let to = ws.dir_for("alice", "t2");
    ws.fork(&from, &to).expect("fork");
    ws.remove(&from).expect("remove");
    ws.remove(&to).expect("remove");
    assert_eq!(marks_left(&marks), Vec::<String>::new(), "programs ran");
    // The same repository does run them for a git that is not told otherwise: the test
    // could have seen them.
    // (The planted programs are no real hooks or filters: git may fail after running them.)
    let _ = Command::new("git")
        .arg("-C")
        .arg(&repo)
        .args(["worktree", "add", "-q"])
        .arg(scratch.path("plain"))
        .output()
        .expect("git");
    let ran = marks_left(&marks);
    for expected in ["reference-transaction", "fsmonitor", "process"] {
        assert!(ran.iter().any(|m| m == expected), "{ran:?}");
    }
}

#[test]
fn git_refuses_a_repository_whose_config_includes_another_file() {
    let scratch = Scratch::new("git-include");
    let repo = repo(&scratch);
    let marks = scratch.path("marks");
    fs::create_dir_all(&marks).expect("marks");
    let included = scratch.path("included.config");
    let hooks = scratch.path("included-hooks");
    planted(&hooks, &marks, "post-checkout");
    write(
        &included,
        &format!("[core]\n\thooksPath = {}\n", hooks.display()),
    );
    git_in(
        &repo,
        &["config", "include.path", &included.display().to_string()],
    );
    let source = Source::Git {
        repo: repo.clone(),
        reference: None,
    };
    let ws = workspaces(&scratch.path("root"), source, Unit::Thread);
    let dir = ws.dir_for("alice", "t1");
    let error = ws.prepare(&dir).expect_err("refused").to_string();
    assert!(error.contains("includes another file"), "{error}");
    assert_eq!(marks_left(&marks), Vec::<String>::new());
}

#[test]
fn git_refuses_a_repository_whose_git_directory_points_elsewhere() {
    let scratch = Scratch::new("git-elsewhere");
    let source = |repo: &Path| Source::Git {
        repo: repo.to_owned(),
        reference: None,
    };
    // A `.git` file (`gitdir: ...`) in place of the directory.
    let linked = repo(&scratch);
    fs::rename(linked.join(".git"), scratch.path("moved.git")).expect("move .git");
    write(
        &linked.join(".git"),
        &format!("gitdir: {}\n", scratch.path("moved.git").display()),
    );
    let ws = workspaces(&scratch.path("root-a"), source(&linked), Unit::Thread);
    let error = ws
        .prepare(&ws.dir_for("alice", "t"))
        .expect_err("refused")
        .to_string();
    assert!(error.contains("not a directory"), "{error}");
    // A `commondir` file in the git directory.
    let other = scratch.path("other");
    fs::create_dir_all(&other).expect("other");
    git_in(&other, &["init", "-q"]);
    let redirected = scratch.path("redirected");
    fs::create_dir_all(&redirected).expect("redirected");
    git_in(&redirected, &["init", "-q"]);
    write(
        &redirected.join(".git/commondir"),
        &other.join(".git").display().to_string(),
    );
    let ws = workspaces(&scratch.path("root-b"), source(&redirected), Unit::Thread);
    let error = ws
        .prepare(&ws.dir_for("alice", "t"))
        .expect_err("refused")
        .to_string();
    assert!(error.contains("commondir"), "{error}");
}

#[test]
fn git_in_a_worktree_keeps_to_its_repository_whatever_the_worktree_record_says() {
    let scratch = Scratch::new("git-commondir");
    let repo = repo(&scratch);
    let ws = workspaces(
        &scratch.path("root"),
        Source::Git {
            repo: repo.clone(),
            reference: None,
        },
        Unit::Thread,
    );
    let dir = ws.dir_for("alice", "t");
    ws.prepare(&dir).expect("prepare");
    write(&dir.join("a.txt"), "changed\n");
    // A repository of the agent's making, whose config runs a program on every file...
    let marks = scratch.path("marks");
    fs::create_dir_all(&marks).expect("marks");
    // (a copy of the real one, so git in the worktree finds its commits there)
    let evil = scratch.path("evil");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(repo.join(".git"))
        .arg(&evil)
        .status()
        .expect("cp");
    assert!(copied.success());
    let clean = planted(&scratch.path("bin"), &marks, "clean");
    git_in(
        &evil,
        &["config", "filter.pwn.clean", &clean.display().to_string()],
    );
    write(&evil.join("info/attributes"), "* filter=pwn\n");
    // ... named as the common directory by the worktree's record in the repository.
    let records = repo.join(".git/worktrees");
    let record = fs::read_dir(&records)
        .expect("records")
        .next()
        .expect("one record")
        .expect("entry")
        .path();
    write(&record.join("commondir"), &evil.display().to_string());
    let _ = ws.changes(&dir, 1 << 20);
    assert_eq!(marks_left(&marks), Vec::<String>::new(), "a program ran");
    // Plain git in the worktree follows the record and runs it: the test could see it.
    let _ = Command::new("git")
        .arg("-C")
        .arg(&dir)
        .args(["diff", "--numstat"])
        .output()
        .expect("git");
    assert_eq!(marks_left(&marks), ["clean"]);
}
