//! The checkpoint store on real workspaces, hostile ones included.
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;

use super::*;

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "agui-checkpoints-{tag}-{}-{}",
            std::process::id(),
            crate::clock::now_ms()
        ));
        fs::create_dir_all(dir.join("workspace")).expect("mkdir");
        fs::create_dir_all(dir.join("store")).expect("mkdir");
        Scratch(dir)
    }

    fn workspace(&self) -> PathBuf {
        self.0.join("workspace")
    }

    fn store(&self) -> Checkpoints {
        Checkpoints::new(&self.0.join("store"))
    }

    fn write(&self, rel: &str, text: &str) {
        let path = self.workspace().join(rel);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, text).expect("write");
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// What checkpoint `name` holds at `path`.
fn shown(store: &Checkpoints, thread: &str, name: &str, path: &str) -> Vec<u8> {
    let repo = store.repo(thread);
    run(
        store.git(&repo).args([
            "cat-file",
            "blob",
            &format!("refs/checkpoints/{name}:{path}"),
        ]),
        "cat-file",
    )
    .expect("the blob")
}

fn tree_of(store: &Checkpoints, thread: &str, name: &str) -> String {
    let repo = store.repo(thread);
    stdout_line(
        run(
            store
                .git(&repo)
                .args(["rev-parse", &format!("refs/checkpoints/{name}^{{tree}}")]),
            "rev-parse",
        )
        .expect("tree"),
    )
}

#[test]
fn a_workspace_is_recorded_and_two_checkpoints_compared_with_line_counts() {
    let s = Scratch::new("compare");
    s.write("a.txt", "one\ntwo\n");
    s.write("src/b.py", "print(1)\n");
    fs::set_permissions(
        s.workspace().join("src/b.py"),
        fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    std::os::unix::fs::symlink("/etc/passwd", s.workspace().join("link")).expect("symlink");
    s.write(".git/HEAD", "ref: refs/heads/main\n");
    let store = s.store();
    let first = store
        .record("t1", "1", &s.workspace(), "")
        .expect("recorded");
    assert_eq!(first.entries, 3, "two files and a symlink, not .git");
    assert_eq!(shown(&store, "t1", "1", "a.txt"), b"one\ntwo\n");
    // The symlink is recorded as one: its target, not what it points to.
    assert_eq!(shown(&store, "t1", "1", "link"), b"/etc/passwd");

    fs::remove_file(s.workspace().join("a.txt")).expect("rm");
    s.write("src/b.py", "print(1)\nprint(2)\nprint(3)\n");
    s.write("c.md", "new\n");
    let second = store
        .record("t1", "2", &s.workspace(), "")
        .expect("recorded");
    assert_ne!(first.commit, second.commit);
    let mut changes = store.changes("t1", "1", "2").expect("changes");
    changes.sort_by(|a, b| a.path.cmp(&b.path));
    let seen: Vec<(&str, &str, Option<u64>, Option<u64>)> = changes
        .iter()
        .map(|c| (c.path.as_str(), c.status.as_str(), c.added, c.removed))
        .collect();
    assert_eq!(
        seen,
        [
            ("a.txt", "deleted", Some(0), Some(2)),
            ("c.md", "added", Some(1), Some(0)),
            ("src/b.py", "modified", Some(2), Some(0)),
        ]
    );
}

#[test]
fn an_unchanged_workspace_records_the_same_tree() {
    let s = Scratch::new("same");
    s.write("a.txt", "same\n");
    let store = s.store();
    store
        .record("t", "1", &s.workspace(), "{\"n\":1}")
        .expect("recorded");
    store
        .record("t", "2", &s.workspace(), "{\"n\":2}")
        .expect("recorded");
    assert_eq!(tree_of(&store, "t", "1"), tree_of(&store, "t", "2"));
    let listed = store.list("t").expect("listed");
    let seen: Vec<(&str, &str)> = listed
        .iter()
        .map(|l| (l.name.as_str(), l.about.as_str()))
        .collect();
    assert_eq!(seen, [("1", "{\"n\":1}"), ("2", "{\"n\":2}")]);
    assert!(listed[0].at > 1_700_000_000);
    assert!(store.list("nobody").expect("listed").is_empty());
    assert!(store.changes("t", "1", "2").expect("changes").is_empty());
}

#[test]
fn nothing_in_the_workspace_runs_or_changes_what_is_recorded() {
    let s = Scratch::new("hostile");
    let marker = s.0.join("ran");
    // A filter the workspace's attributes name, defined in a config planted in its .git,
    // a hook and an fsmonitor there too.
    s.write(".gitattributes", "* filter=evil\n");
    s.write(
        ".git/config",
        &format!(
            "[filter \"evil\"]\n\tclean = touch {m}\n\tsmudge = touch {m}\n[core]\n\tfsmonitor = touch {m}\n\thooksPath = .\n",
            m = marker.display()
        ),
    );
    s.write("secret.txt", "as written\n");
    let store = s.store();
    store
        .record("t", "1", &s.workspace(), "")
        .expect("recorded");
    assert_eq!(shown(&store, "t", "1", "secret.txt"), b"as written\n");
    assert!(!marker.exists(), "a program of the workspace's ran");
}

#[test]
fn any_name_a_file_may_have_is_recorded() {
    let s = Scratch::new("names");
    let odd = [
        b"quote\"d".to_vec(),
        b"back\\slash".to_vec(),
        b"new\nline".to_vec(),
        b"tab\there".to_vec(),
        b"\"leading".to_vec(),
        b"caf\xc3\xa9".to_vec(),
        b"raw\xff".to_vec(),
    ];
    for name in &odd {
        let path = s.workspace().join(std::ffi::OsStr::from_bytes(name));
        fs::write(path, name).expect("write");
    }
    let store = s.store();
    let recorded = store
        .record("t", "1", &s.workspace(), "")
        .expect("recorded");
    assert_eq!(recorded.entries, odd.len());
    let repo = store.repo("t");
    let listed = run(
        store
            .git(&repo)
            .args(["ls-tree", "-z", "--name-only", "refs/checkpoints/1"]),
        "ls-tree",
    )
    .expect("listed");
    let mut names: Vec<Vec<u8>> = listed
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    names.sort();
    let mut expected = odd.clone();
    expected.sort();
    assert_eq!(names, expected);
}

#[test]
fn names_are_checked_and_a_thread_s_checkpoints_go_with_it() {
    let s = Scratch::new("names-refused");
    s.write("a", "a");
    let store = s.store();
    for bad in ["", "../x", ".hidden", "a/b", "a b", "x\n"] {
        assert!(
            matches!(
                store.record("t", bad, &s.workspace(), ""),
                Err(WorkspaceError::BadPath(_))
            ),
            "{bad:?} was taken"
        );
    }
    store
        .record("t", "1", &s.workspace(), "")
        .expect("recorded");
    assert!(store.repo("t").is_dir());
    store.remove("t").expect("removed");
    assert!(!store.repo("t").exists());
    store.remove("t").expect("removing nothing is fine");
}

/// The workspace as (path, kind and content) triples, `.git` left out.
fn picture(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in fs::read_dir(&at).expect("read_dir").flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(dir).expect("under").display().to_string();
            if rel == ".git" {
                continue;
            }
            let meta = fs::symlink_metadata(&path).expect("meta");
            let what = if meta.file_type().is_symlink() {
                format!("link {}", fs::read_link(&path).expect("link").display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir".to_owned()
            } else {
                let exec = meta.permissions().mode() & 0o111 != 0;
                format!(
                    "file{} {}",
                    if exec { " exec" } else { "" },
                    String::from_utf8_lossy(&fs::read(&path).expect("read"))
                )
            };
            out.push((rel, what));
        }
    }
    out.sort();
    out
}

#[test]
fn a_workspace_is_put_back_as_its_checkpoint_holds_it() {
    let s = Scratch::new("restore");
    s.write("a.txt", "one\n");
    s.write("src/b.py", "print(1)\n");
    fs::set_permissions(
        s.workspace().join("src/b.py"),
        fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    s.write("same.txt", "untouched\n");
    std::os::unix::fs::symlink("/etc/passwd", s.workspace().join("link")).expect("symlink");
    s.write(".git/HEAD", "ref: refs/heads/main\n");
    let store = s.store();
    store
        .record("t", "1", &s.workspace(), "")
        .expect("recorded");
    let before = picture(&s.workspace());
    let untouched = fs::metadata(s.workspace().join("same.txt"))
        .expect("meta")
        .modified()
        .expect("mtime");

    // The turn after it: a file changed, one deleted, one made executable no more, new
    // files and directories, the symlink pointed elsewhere.
    s.write("a.txt", "changed\n");
    fs::remove_file(s.workspace().join("src/b.py")).expect("rm");
    s.write("new.txt", "new\n");
    s.write("junk/deep/x", "x\n");
    fs::remove_file(s.workspace().join("link")).expect("rm");
    std::os::unix::fs::symlink("/etc/hostname", s.workspace().join("link")).expect("symlink");
    s.write(".git/HEAD", "ref: refs/heads/other\n");

    let written = store.restore("t", "1", &s.workspace()).expect("restored");
    assert_eq!(picture(&s.workspace()), before);
    assert_eq!(
        written, 3,
        "a.txt, src/b.py and link; same.txt is left as it was"
    );
    let after = fs::metadata(s.workspace().join("same.txt"))
        .expect("meta")
        .modified()
        .expect("mtime");
    assert_eq!(untouched, after);
    // The workspace's own repository is not the checkpoint's business.
    assert_eq!(
        fs::read_to_string(s.workspace().join(".git/HEAD")).expect("read"),
        "ref: refs/heads/other\n"
    );
}

#[test]
fn a_symlink_planted_where_a_directory_or_file_belongs_is_removed_not_written_through() {
    let s = Scratch::new("restore-links");
    let outside = s.0.join("outside");
    fs::create_dir_all(&outside).expect("mkdir");
    fs::write(outside.join("a.txt"), "outside\n").expect("write");
    s.write("a.txt", "inside\n");
    s.write("src/b.py", "print(1)\n");
    let store = s.store();
    store
        .record("t", "1", &s.workspace(), "")
        .expect("recorded");
    let before = picture(&s.workspace());

    fs::remove_file(s.workspace().join("a.txt")).expect("rm");
    std::os::unix::fs::symlink(outside.join("a.txt"), s.workspace().join("a.txt"))
        .expect("symlink");
    fs::remove_dir_all(s.workspace().join("src")).expect("rm");
    std::os::unix::fs::symlink(&outside, s.workspace().join("src")).expect("symlink");

    store.restore("t", "1", &s.workspace()).expect("restored");
    assert_eq!(picture(&s.workspace()), before);
    assert_eq!(
        fs::read_to_string(outside.join("a.txt")).expect("read"),
        "outside\n"
    );
    assert!(!outside.join("b.py").exists(), "written through a symlink");
}

#[test]
fn an_unknown_checkpoint_changes_nothing() {
    let s = Scratch::new("restore-unknown");
    s.write("a.txt", "a\n");
    let store = s.store();
    store
        .record("t", "1", &s.workspace(), "")
        .expect("recorded");
    s.write("b.txt", "b\n");
    let before = picture(&s.workspace());
    assert!(store.restore("t", "9", &s.workspace()).is_err());
    assert!(store.restore("other", "1", &s.workspace()).is_err());
    assert_eq!(picture(&s.workspace()), before);
}

#[test]
fn a_file_too_large_to_record_is_left_out_and_never_removed() {
    let s = Scratch::new("large");
    s.write("small.txt", "small\n");
    let big = s.workspace().join("big.bin");
    let file = fs::File::create(&big).expect("create");
    file.set_len(MAX_FILE + 1).expect("sparse");
    let store = s.store();
    let recorded = store
        .record("t", "1", &s.workspace(), "")
        .expect("recorded");
    assert_eq!(recorded.entries, 1, "only the small file");
    fs::remove_file(s.workspace().join("small.txt")).expect("rm");
    store.restore("t", "1", &s.workspace()).expect("restored");
    assert!(s.workspace().join("small.txt").is_file());
    assert_eq!(fs::metadata(&big).expect("kept").len(), MAX_FILE + 1);
}

#[test]
fn only_the_newest_turns_are_kept_and_what_only_older_ones_held_is_freed() {
    let s = Scratch::new("retention");
    let store = s.store();
    let turns = 3;
    let total = turns + PRUNE_SLACK;
    let mut blobs = Vec::new();
    for i in 0..=total {
        s.write("notes.md", &format!("turn {i}\n"));
        let name = format!("{}", 1000 + i);
        store
            .record("t", &name, &s.workspace(), "")
            .expect("recorded");
        store
            .record("t", &format!("{name}-after"), &s.workspace(), "")
            .expect("recorded");
        let repo = store.repo("t");
        blobs.push(stdout_line(
            run(
                store
                    .git(&repo)
                    .args(["rev-parse", &format!("refs/checkpoints/{name}:notes.md")]),
                "rev-parse",
            )
            .expect("blob"),
        ));
        let gone = store.keep_newest("t", turns).expect("kept");
        // Nothing goes until the slack is used up; then all but the newest go at once.
        assert_eq!(
            gone,
            if i == total { total + 1 - turns } else { 0 },
            "turn {i}"
        );
    }
    let names: Vec<String> = store
        .list("t")
        .expect("listed")
        .into_iter()
        .map(|l| l.name)
        .collect();
    let newest: Vec<String> = (total + 1 - turns..=total)
        .flat_map(|i| [format!("{}", 1000 + i), format!("{}-after", 1000 + i)])
        .collect();
    let mut sorted = newest.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    // The oldest turn's file is gone from the store; the newest's is there.
    let repo = store.repo("t");
    let exists = |blob: &str| {
        store
            .git(&repo)
            .args(["cat-file", "-e", blob])
            .status()
            .expect("git")
            .success()
    };
    assert!(!exists(&blobs[0]), "freed");
    assert!(exists(&blobs[total]), "kept");
    assert_eq!(
        shown(&store, "t", &newest[0], "notes.md"),
        format!("turn {}\n", total + 1 - turns).as_bytes()
    );
}

#[test]
fn writes_go_through_the_handle_held_not_a_symlink_swapped_in_meanwhile() {
    use super::beneath::{Beneath, write_at};
    let s = Scratch::new("beneath");
    let outside = s.0.join("outside");
    fs::create_dir_all(&outside).expect("mkdir");
    // A symlink where a directory belongs is replaced by a real directory.
    std::os::unix::fs::symlink(&outside, s.workspace().join("a")).expect("symlink");
    let beneath = Beneath::open(&s.workspace()).expect("open");
    let a = beneath
        .dir(Path::new("a/b"), true)
        .expect("made")
        .expect("a directory");
    assert!(
        fs::symlink_metadata(s.workspace().join("a"))
            .expect("a")
            .is_dir()
    );
    // The directory held is swapped for a symlink to elsewhere after it was opened: the
    // write still lands in the directory held, never elsewhere.
    fs::rename(s.workspace().join("a"), s.0.join("moved")).expect("move");
    std::os::unix::fs::symlink(&outside, s.workspace().join("a")).expect("symlink");
    write_at(&a, std::ffi::OsStr::new("f"), false, false, b"x").expect("written");
    assert_eq!(
        fs::read(s.0.join("moved/b/f")).expect("written there"),
        b"x"
    );
    assert_eq!(
        fs::read_dir(&outside).expect("outside").count(),
        0,
        "nothing outside"
    );
    // Without making, a symlink on the way is no directory.
    assert!(
        beneath
            .dir(Path::new("a/b"), false)
            .expect("looked")
            .is_none()
    );
}
