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
