use std::collections::HashSet;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

mod worktrees;

/// A directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("agui-ws-{tag}-{}-{n}-{nanos}", std::process::id()));
        fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(fs::canonicalize(&dir).expect("canonical scratch dir"))
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = tree::remove_tree(&self.0);
    }
}

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("create parent");
    }
    fs::write(path, text).expect("write file");
}

/// A changed file as `(path, status, size, added, removed)`.
type Row<'a> = (&'a str, &'a str, u64, Option<u64>, Option<u64>);

/// Each changed file as a [`Row`].
fn rows(changes: &Changes) -> Vec<Row<'_>> {
    changes
        .files
        .iter()
        .map(|f| {
            (
                f.path.as_str(),
                f.status.as_str(),
                f.size,
                f.added,
                f.removed,
            )
        })
        .collect()
}

fn workspaces(root: &Path, source: Source, unit: Unit) -> Workspaces {
    let config = WorkspaceConfig {
        source,
        root: root.to_path_buf(),
        quota: None,
        unit,
        checkpoints: crate::workspace::DEFAULT_CHECKPOINTS,
    };
    Workspaces::new("coder", config)
}

fn bad_path(result: Result<impl std::fmt::Debug, WorkspaceError>, says: &str) {
    match result {
        Err(WorkspaceError::BadPath(why)) => assert!(why.contains(says), "{why:?} vs {says:?}"),
        other => panic!("expected BadPath({says:?}), got {other:?}"),
    }
}

#[test]
fn names_map_to_distinct_deterministic_single_segments() {
    let long = "x".repeat(256);
    let prefix = "p".repeat(32);
    let names = [
        "../x".to_owned(),
        "a/b".to_owned(),
        "ab".to_owned(),
        String::new(),
        "..".to_owned(),
        ".".to_owned(),
        ".hidden".to_owned(),
        "a b".to_owned(),
        "ünï cödé/✓".to_owned(),
        long.clone(),
        format!("{prefix}a"),
        format!("{prefix}b"),
        "_operator".to_owned(),
        "-".to_owned(),
    ];
    let mut seen = HashSet::new();
    for name in &names {
        let segment = name_segment(name);
        assert_eq!(segment, name_segment(name), "deterministic");
        assert!(!segment.is_empty() && segment.len() <= 65, "{segment}");
        assert!(!segment.starts_with('.') && segment != "..", "{segment}");
        assert!(
            segment
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
            "{segment}"
        );
        assert_eq!(Path::new(&segment).components().count(), 1);
        assert!(seen.insert(segment), "collision for {name:?}");
    }
    assert_eq!(name_segment(""), "_operator");
    assert_eq!(
        name_segment("alice"),
        "alice-2bd806c97f0e00af1a1fc3328fa763a9"
    );
    assert_eq!(
        name_segment("../x"),
        format!("x-{}", crate::hex::short_hash(b"../x"))
    );
    assert!(name_segment(&long).starts_with(&format!("{}-", "x".repeat(32))));

    let ws = workspaces(Path::new("/srv/ws"), Source::Empty, Unit::Thread);
    let dir = ws.dir_for("../x", "a/b");
    assert_eq!(
        dir.strip_prefix("/srv/ws/coder")
            .map(|p| p.components().count()),
        Ok(3)
    );
    assert_eq!(
        dir,
        ws.principal_dir("../x")
            .join("threads")
            .join(name_segment("a/b"))
    );
    let shared = workspaces(Path::new("/srv/ws"), Source::Empty, Unit::Principal);
    assert_eq!(
        shared.dir_for("", "t1"),
        Path::new("/srv/ws/coder/_operator/shared")
    );
    assert_eq!(shared.dir_for("", "t1"), shared.dir_for("", "t2"));
}

#[test]
fn sources_parse_and_print() {
    let cases = [
        ("empty", Source::Empty),
        ("template:/t", Source::Template("/t".into())),
        (
            "git:/r",
            Source::Git {
                repo: "/r".into(),
                reference: None,
            },
        ),
        (
            "git:/r@feature/x",
            Source::Git {
                repo: "/r".into(),
                reference: Some("feature/x".to_owned()),
            },
        ),
        (
            "git:/a@b/r@HEAD",
            Source::Git {
                repo: "/a@b/r".into(),
                reference: Some("HEAD".to_owned()),
            },
        ),
    ];
    for (text, source) in cases {
        assert_eq!(Source::parse(text), Ok(source.clone()), "{text}");
        assert_eq!(source.to_string(), text);
    }
    for (text, says) in [
        ("template:rel/dir", "relative"),
        ("git:repo", "relative"),
        ("git:/r@", "empty"),
        ("git:/r@-c", "starts with '-'"),
        ("git:/r@a b", "space"),
        ("template:", "empty"),
        ("copy:/x", "unknown workspace source"),
    ] {
        let err = Source::parse(text).expect_err(text);
        assert!(err.contains(says), "{text}: {err}");
    }
}

#[test]
fn empty_prepare_is_idempotent_and_sweeps_leftovers() {
    let scratch = Scratch::new("empty");
    let ws = workspaces(&scratch.0, Source::Empty, Unit::Thread);
    let dir = ws.dir_for("alice", "t1");
    let threads = dir.parent().expect("parent").to_path_buf();
    let name = dir
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let leftover = threads.join(format!(".{name}.part-pdeadtbeef-0"));
    fs::create_dir_all(leftover.join("inner")).expect("leftover");
    ws.prepare(&dir).expect("prepare");
    assert!(dir.is_dir());
    assert!(!leftover.exists(), "a crashed build is swept");
    write(&dir.join("kept.txt"), "x");
    ws.prepare(&dir).expect("prepare again");
    assert!(dir.join("kept.txt").exists());
    let names: Vec<_> = fs::read_dir(&threads).expect("threads").flatten().collect();
    assert_eq!(names.len(), 1, "nothing beside the workspace");
}

#[test]
fn template_prepare_copies_files_modes_and_symlinks_as_symlinks() {
    let scratch = Scratch::new("template");
    let template = scratch.path("template");
    write(&template.join("sub/run.sh"), "#!/bin/sh\n");
    fs::set_permissions(
        template.join("sub/run.sh"),
        fs::Permissions::from_mode(0o750),
    )
    .expect("chmod");
    symlink("sub/run.sh", template.join("inside")).expect("symlink");
    symlink("/nonexistent/target", template.join("dangling")).expect("symlink");
    let outside = scratch.path("outside.txt");
    write(&outside, "secret");
    symlink(&outside, template.join("outward")).expect("symlink");
    let ws = workspaces(
        &scratch.path("root"),
        Source::Template(template),
        Unit::Thread,
    );
    let dir = ws.dir_for("alice", "t1");
    ws.prepare(&dir).expect("prepare");
    assert_eq!(
        fs::read_to_string(dir.join("sub/run.sh")).expect("copied"),
        "#!/bin/sh\n"
    );
    let mode = fs::metadata(dir.join("sub/run.sh"))
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750);
    for (link, target) in [
        ("inside", PathBuf::from("sub/run.sh")),
        ("dangling", PathBuf::from("/nonexistent/target")),
        ("outward", outside),
    ] {
        let meta = fs::symlink_metadata(dir.join(link)).expect("link copied");
        assert!(meta.file_type().is_symlink(), "{link} stays a symlink");
        assert_eq!(fs::read_link(dir.join(link)).expect("target"), target);
    }
    write(&dir.join("sub/run.sh"), "changed");
    ws.prepare(&dir).expect("prepare again");
    assert_eq!(
        fs::read_to_string(dir.join("sub/run.sh")).expect("kept"),
        "changed"
    );
}

#[test]
fn a_symlinked_workspace_or_parent_is_refused() {
    let scratch = Scratch::new("swap");
    let ws = workspaces(&scratch.path("root"), Source::Empty, Unit::Thread);
    let dir = ws.dir_for("alice", "t1");
    fs::create_dir_all(dir.parent().expect("parent")).expect("threads");
    let elsewhere = scratch.path("elsewhere");
    fs::create_dir_all(&elsewhere).expect("elsewhere");
    write(&elsewhere.join("f"), "x");
    symlink(&elsewhere, &dir).expect("symlink");
    bad_path(ws.prepare(&dir), "symlink");
    bad_path(list(&dir, ""), "symlink");
    bad_path(usage(&dir), "symlink");
    ws.remove(&dir).expect("remove takes the symlink away");
    assert!(elsewhere.join("f").exists(), "not followed");
    let threads = dir.parent().expect("parent");
    fs::remove_dir(threads).expect("rmdir");
    symlink(&elsewhere, threads).expect("symlink parent");
    bad_path(ws.prepare(&dir), "parent");
}

#[test]
fn a_thread_adopts_a_spare_workspace_and_keeps_it_until_removed() {
    let scratch = Scratch::new("spare");
    let ws = workspaces(&scratch.0, Source::Empty, Unit::Thread);
    let spare = ws.spare_dir("alice");
    assert!(Workspaces::is_spare(&spare));
    assert_eq!(spare.parent(), ws.dir_for("alice", "t1").parent());
    assert_ne!(spare, ws.spare_dir("alice"), "each spare a name of its own");
    assert!(
        !Workspaces::is_spare(&ws.dir_for("alice", "_spare.0123")),
        "no thread's directory is a spare's"
    );
    // Nothing to adopt before it is made.
    assert!(matches!(
        ws.adopt("alice", "t1", &spare),
        Err(WorkspaceError::NotFound)
    ));
    ws.prepare(&spare).expect("prepare");
    write(&spare.join("a.txt"), "hello\n");
    assert_eq!(ws.resolve("alice", "t1"), ws.dir_for("alice", "t1"));
    // Another principal's spare, or a thread's own directory, is not one to adopt.
    bad_path(ws.adopt("bob", "t1", &spare), "not a spare");
    bad_path(
        ws.adopt("alice", "t1", &ws.dir_for("alice", "t2")),
        "not a spare",
    );
    ws.adopt("alice", "t1", &spare).expect("adopt");
    assert_eq!(ws.resolve("alice", "t1"), spare);
    assert_eq!(ws.resolve("alice", "t2"), ws.dir_for("alice", "t2"));
    // Adopted once: neither again nor by a thread with a workspace of its own.
    let other = ws.spare_dir("alice");
    ws.prepare(&other).expect("prepare");
    bad_path(ws.adopt("alice", "t1", &other), "already");
    ws.prepare(&ws.dir_for("alice", "t2")).expect("prepare");
    bad_path(ws.adopt("alice", "t2", &other), "already");
    // A fork copies it, the sweep keeps it (an adopted spare), removal takes both.
    let forked = ws.dir_for("alice", "t3");
    ws.fork(&ws.resolve("alice", "t1"), &forked).expect("fork");
    assert_eq!(
        fs::read_to_string(forked.join("a.txt")).expect("copied"),
        "hello\n"
    );
    assert_eq!(ws.sweep_spares(), 1, "only the spare nobody adopted");
    assert!(!other.exists());
    assert!(spare.join("a.txt").exists());
    ws.remove_thread("alice", "t1").expect("remove");
    assert!(!spare.exists());
    assert_eq!(ws.resolve("alice", "t1"), ws.dir_for("alice", "t1"));
    ws.remove_thread("alice", "t1").expect("absent is fine");
}

#[test]
fn a_record_that_names_no_spare_is_no_record() {
    let scratch = Scratch::new("record");
    let ws = workspaces(&scratch.0, Source::Empty, Unit::Thread);
    let own = ws.dir_for("alice", "t1");
    let record = own.with_file_name(format!(
        "{}.at",
        own.file_name().and_then(|n| n.to_str()).expect("name")
    ));
    for bad in ["../../elsewhere", "_spare.XYZ", "t2-0123", ""] {
        write(&record, bad);
        assert_eq!(ws.resolve("alice", "t1"), own, "{bad:?}");
    }
    let _ = fs::remove_file(&record);
    symlink(scratch.path("elsewhere"), &record).expect("symlink");
    assert_eq!(ws.resolve("alice", "t1"), own, "a symlink is no record");
    // With one workspace per principal there are no spares to resolve to.
    let shared = workspaces(&scratch.0, Source::Empty, Unit::Principal);
    assert_eq!(shared.resolve("alice", "t1"), shared.dir_for("alice", "t1"));
}

#[test]
fn fork_and_remove_copy_and_delete_plain_workspaces() {
    let scratch = Scratch::new("fork");
    let ws = workspaces(&scratch.0, Source::Empty, Unit::Thread);
    let from = ws.dir_for("alice", "t1");
    let to = ws.dir_for("alice", "t2");
    assert!(matches!(ws.fork(&from, &to), Err(WorkspaceError::NotFound)));
    ws.prepare(&from).expect("prepare");
    write(&from.join("notes/a.txt"), "hello\n");
    symlink("notes/a.txt", from.join("link")).expect("symlink");
    ws.fork(&from, &to).expect("fork");
    assert_eq!(
        fs::read_to_string(to.join("notes/a.txt")).expect("copied"),
        "hello\n"
    );
    assert!(
        fs::symlink_metadata(to.join("link"))
            .expect("link")
            .file_type()
            .is_symlink()
    );
    ws.fork(&from, &from)
        .expect("forking onto itself does nothing");
    fs::set_permissions(to.join("notes"), fs::Permissions::from_mode(0o500)).expect("chmod");
    ws.remove(&to).expect("remove");
    assert!(!to.exists());
    ws.remove(&to).expect("absent is fine");
    assert!(from.join("notes/a.txt").exists());
}

#[test]
fn template_changes_list_added_modified_and_deleted_files() {
    let scratch = Scratch::new("tplchanges");
    let template = scratch.path("template");
    write(&template.join("keep.txt"), "same\n");
    write(&template.join("mod.txt"), "a\nb\nc\n");
    write(&template.join("del.txt"), "gone\n");
    fs::write(template.join("blob.bin"), [0u8, 1, 2]).expect("binary");
    let ws = workspaces(
        &scratch.path("root"),
        Source::Template(template),
        Unit::Thread,
    );
    let dir = ws.dir_for("", "t1");
    ws.prepare(&dir).expect("prepare");
    write(&dir.join("mod.txt"), "a\nB\nc\n");
    fs::remove_file(dir.join("del.txt")).expect("delete");
    write(&dir.join("new/n.txt"), "x\ny\n");
    fs::write(dir.join("blob.bin"), [3u8, 0, 4, 5]).expect("binary");
    write(&dir.join(".git/config"), "ignored");
    let changes = ws.changes(&dir, 1 << 20).expect("changes");
    assert_eq!(changes.base, "template");
    let files = rows(&changes);
    assert_eq!(
        files,
        [
            ("blob.bin", "modified", 4, None, None),
            ("del.txt", "deleted", 5, Some(0), Some(1)),
            ("mod.txt", "modified", 6, Some(1), Some(1)),
            ("new/n.txt", "added", 4, Some(2), Some(0)),
        ]
    );
    let diff = changes.diff.expect("diff");
    assert!(diff.contains("--- a/mod.txt\n+++ b/mod.txt\n"), "{diff}");
    assert!(
        diff.contains("-b\n+B\n") && diff.contains("+++ b/new/n.txt"),
        "{diff}"
    );
    assert!(!changes.truncated);
    let cut = ws.changes(&dir, 30).expect("changes");
    assert!(cut.truncated && cut.diff.expect("diff").len() <= 30);
}

#[test]
fn empty_changes_list_every_file_with_its_size() {
    let scratch = Scratch::new("emptychanges");
    let ws = workspaces(&scratch.0, Source::Empty, Unit::Thread);
    let dir = ws.dir_for("alice", "t1");
    ws.prepare(&dir).expect("prepare");
    write(&dir.join("a.txt"), "1\n2\n3\n");
    fs::write(dir.join("b.bin"), [0u8; 7]).expect("binary");
    write(&dir.join(".git/HEAD"), "left out");
    let changes = ws.changes(&dir, 100).expect("changes");
    let files: Vec<_> = changes
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.status.as_str(), f.size, f.added))
        .collect();
    assert_eq!(
        files,
        [("a.txt", "added", 6, Some(3)), ("b.bin", "added", 7, None)]
    );
    assert_eq!(
        (changes.base.as_str(), changes.diff, changes.truncated),
        ("empty", None, false)
    );
    let json = serde_json::to_value(ws.changes(&dir, 100).expect("changes")).expect("json");
    assert_eq!(json["truncated"], false);
    assert_eq!(json["files"][0]["status"], "added");
}

#[test]
fn list_and_read_stay_inside_the_workspace() {
    let scratch = Scratch::new("paths");
    let ws = workspaces(&scratch.path("root"), Source::Empty, Unit::Thread);
    let dir = ws.dir_for("alice", "t1");
    ws.prepare(&dir).expect("prepare");
    write(&dir.join("f.txt"), "hello");
    write(&dir.join("d/inner.txt"), "inner");
    let outside = scratch.path("outside.txt");
    write(&outside, "secret");
    symlink("f.txt", dir.join("to_file")).expect("symlink");
    symlink(dir.join("d"), dir.join("to_dir")).expect("symlink");
    symlink("/etc", dir.join("etc")).expect("symlink");
    symlink(&outside, dir.join("out")).expect("symlink");
    symlink("../../../../../../outside.txt", dir.join("d/up")).expect("symlink");

    bad_path(read(&dir, "../x", 100), "`..`");
    bad_path(read(&dir, "d/../f.txt", 100), "`..`");
    bad_path(read(&dir, "/etc/passwd", 100), "absolute");
    bad_path(list(&dir, "/"), "absolute");
    bad_path(read(&dir, "f\0.txt", 100), "NUL");
    bad_path(read(&dir, "etc/passwd", 100), "outside");
    bad_path(list(&dir, "etc"), "outside");
    bad_path(read(&dir, "out", 100), "outside");
    bad_path(read(&dir, "d/up", 100), "outside");
    bad_path(read(&dir, "d", 100), "directory");
    bad_path(list(&dir, "f.txt"), "not a directory");
    assert!(matches!(
        read(&dir, "missing", 100),
        Err(WorkspaceError::NotFound)
    ));
    assert!(matches!(list(&dir, "nope"), Err(WorkspaceError::NotFound)));

    assert_eq!(read(&dir, "f.txt", 5).expect("read"), b"hello");
    assert_eq!(read(&dir, "./to_file", 100).expect("inside link"), b"hello");
    assert_eq!(
        read(&dir, "to_dir/inner.txt", 100).expect("inside link"),
        b"inner"
    );
    assert!(matches!(
        read(&dir, "f.txt", 4),
        Err(WorkspaceError::TooLarge { size: 5, cap: 4 })
    ));
    let inner: Vec<_> = list(&dir, "to_dir")
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(inner, ["inner.txt", "up"]);
    let root = list(&dir, "").expect("list");
    assert_eq!(root, list(&dir, ".").expect("list"));
    let kinds: Vec<_> = root
        .iter()
        .map(|e| (e.name.as_str(), e.kind, e.size))
        .collect();
    assert_eq!(
        kinds,
        [
            ("d", EntryKind::Dir, 0),
            ("etc", EntryKind::Symlink, 0),
            ("f.txt", EntryKind::File, 5),
            ("out", EntryKind::Symlink, 0),
            ("to_dir", EntryKind::Symlink, 0),
            ("to_file", EntryKind::Symlink, 0),
        ]
    );
    let json = serde_json::to_value(&root[0]).expect("json");
    assert_eq!(
        json,
        serde_json::json!({"name": "d", "kind": "dir", "size": 0})
    );
}

#[test]
fn snapshot_reports_changed_files_with_line_counts() {
    let scratch = Scratch::new("snapshot");
    let dir = scratch.path("ws");
    write(&dir.join("m.txt"), "a\nb\nc\n");
    write(&dir.join("d.txt"), "gone\n");
    write(&dir.join("same.txt"), "same\n");
    write(&dir.join(".git/index"), "left out");
    let before = Snapshot::take(&dir);
    write(&dir.join("m.txt"), "a\nB\nc\n");
    write(&dir.join("sub/n.txt"), "x\ny\n");
    fs::remove_file(dir.join("d.txt")).expect("delete");
    write(&dir.join("same.txt"), "same\n");
    write(&dir.join(".git/index"), "changed, still left out");
    let change = |path: &str, added, removed| FileChange {
        path: path.to_owned(),
        added,
        removed,
    };
    assert_eq!(
        before.changed(&dir),
        [
            change("d.txt", 0, 1),
            change("m.txt", 1, 1),
            change("sub/n.txt", 2, 0),
        ]
    );
    assert_eq!(Snapshot::take(&dir).changed(&dir), []);
    // A workspace that did not exist yet: everything in it is new.
    assert_eq!(
        Snapshot::take(&scratch.path("missing")).changed(&dir).len(),
        3
    );
}

#[test]
fn usage_counts_regular_file_bytes_and_walks_are_capped() {
    let scratch = Scratch::new("usage");
    let dir = scratch.path("ws");
    write(&dir.join("a"), &"x".repeat(10));
    write(&dir.join("deep/er/b"), &"y".repeat(20));
    let big = scratch.path("big");
    write(&big, &"z".repeat(1000));
    symlink(&big, dir.join("link")).expect("symlink");
    assert_eq!(usage(&dir).expect("usage"), 30);
    assert!(matches!(
        usage(&scratch.path("none")),
        Err(WorkspaceError::NotFound)
    ));
    let walk = tree::Tree::workspace(&dir)
        .expect("tree")
        .walk(3, false, |_, _| Ok(()));
    assert!(matches!(
        walk,
        Err(WorkspaceError::TooManyEntries { cap: 3 })
    ));
    let mut ws = workspaces(&scratch.0, Source::Empty, Unit::Thread);
    assert!(!ws.over_quota(&dir, None));
    ws.config.quota = Some(29);
    assert!(ws.over_quota(&dir, None));
    ws.config.quota = Some(30);
    assert!(!ws.over_quota(&dir, None));
    // A workspace not made yet is not over.
    assert!(!ws.over_quota(&scratch.path("none"), None));
    // Space reserved past a file's end counts (beyond a little slack).
    let reserved = scratch.path("reserved");
    fs::create_dir_all(&reserved).expect("reserved");
    write(&reserved.join("empty-looking"), "");
    let status = std::process::Command::new("fallocate")
        .args(["--keep-size", "-l", "1M"])
        .arg(reserved.join("empty-looking"))
        .status()
        .expect("fallocate (util-linux)");
    assert!(status.success());
    assert_eq!(
        fs::metadata(reserved.join("empty-looking"))
            .expect("file")
            .len(),
        0
    );
    assert!(usage(&reserved).expect("usage") >= 1024 * 1024 - 64 * 1024);
    // The agent home counts with the workspace.
    let home = scratch.path("home");
    write(&home.join("cache"), "12345");
    assert!(ws.over_quota(&dir, Some(&home)));
    assert!(!ws.over_quota(&dir, Some(&scratch.path("no-home"))));
}

#[test]
fn opening_through_a_swapped_in_symlink_is_caught_after_the_open() {
    let scratch = Scratch::new("swapped");
    let dir = scratch.path("ws");
    fs::create_dir_all(&dir).expect("ws");
    symlink("/etc", dir.join("etc")).expect("symlink");
    let tree = tree::Tree::workspace(&dir).expect("tree");
    // As if the checks had passed on a real directory that was then replaced.
    bad_path(tree.open(&dir.join("etc/passwd"), false), "outside");
    bad_path(tree.open(&dir.join("etc/ssl"), true), "outside");
    symlink("/etc/passwd", dir.join("pw")).expect("symlink");
    bad_path(tree.open(&dir.join("pw"), false), "symlink appeared");
    // A directory that became a symlink is not a directory any more.
    assert!(matches!(
        tree.open(&dir.join("etc"), true),
        Err(WorkspaceError::NotFound)
    ));
}
