//! Workspaces and confinement, with the scripted ACP agent as the probe: a confined agent
//! of one principal tries what a prompt-injected agent tries (the daemon's data directory,
//! database, keys and token file, its `$HOME` and `/proc/<pid>/environ`, another
//! principal's workspace and home, writes outside its workspace, a planted symlink, the
//! daemon's port, a signal to the daemon) and each attempt is refused; the same probe with
//! `confinement = "none"` succeeds, so the refusals are the confinement's.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agui_serve::config::AgentKind;
use agui_serve::confine::Confinement;
use agui_serve::workspace::Source;
use serde_json::{Value, json};
use support::probe::*;
use support::*;

fn cwd_of(reply: &str) -> PathBuf {
    PathBuf::from(reply.strip_prefix("Cwd: ").expect("a cwd"))
}

/// What an adversarial agent of `bob` tries, given what `alice` has.
fn escapes(s: &Setup, alice_cwd: &Path) -> Value {
    let data = &s.data;
    let home = std::env::var("HOME").expect("HOME");
    json!({
        "read": [
            data.join("agui-serve.db").display().to_string(),
            data.join("token-signing.key").display().to_string(),
            s.token_file.display().to_string(),
            format!("/proc/{}/environ", std::process::id()),
            // The host's password hashes (a root daemon's agent reads them otherwise).
            "/etc/shadow".to_owned(),
            alice_cwd.join("mine.txt").display().to_string(),
            "leak",
        ],
        "list": [
            data.display().to_string(),
            data.join("homes").display().to_string(),
            home,
            alice_cwd.display().to_string(),
        ],
        "write": [
            data.join("planted").display().to_string(),
            "/tmp/agui-probe-outside",
            alice_cwd.join("theirs.txt").display().to_string(),
        ],
        "connect": [s.server.addr.to_string()],
        "signal": [std::process::id().to_string()],
    })
}

/// Alice writes a file in her thread's workspace; Bob, on a thread of the same id, plants a
/// symlink to the database in his and runs every escape. The outcomes, with the daemon
/// and Bob's token, and Alice's workspace.
async fn escape_attempts(
    tag: &str,
    confinement: Confinement,
) -> (Setup, String, PathBuf, serde_json::Map<String, Value>) {
    let s = setup(tag, move |c, d| {
        c.agents = vec![probe_agent("probe", confinement, d, None)];
    })
    .await;
    let (alice, bob) = (
        token_for(&s.server, "alice").await,
        token_for(&s.server, "bob").await,
    );
    let mine = say(&s.server, &alice, "probe", "t", "write mine.txt alice's").await;
    assert_eq!(mine, "Wrote mine.txt");
    let alice_cwd = cwd_of(&say(&s.server, &alice, "probe", "t", "pwd").await);
    assert!(alice_cwd.join("mine.txt").exists());
    let db = s.data.join("agui-serve.db");
    assert!(db.exists(), "the database the probe aims at exists");
    let plant = format!("symlink leak {}", db.display());
    assert_eq!(
        say(&s.server, &bob, "probe", "t", &plant).await,
        "Linked leak"
    );
    let outcomes = probe(&s.server, &bob, "probe", "t", escapes(&s, &alice_cwd)).await;
    let Value::Object(outcomes) = outcomes else {
        panic!("outcomes: {outcomes}");
    };
    assert_eq!(outcomes.len(), 16, "every attempt reported: {outcomes:?}");
    (s, bob, alice_cwd, outcomes)
}

#[tokio::test]
async fn a_confined_agent_reaches_nothing_of_the_daemon_or_another_principal() {
    let (s, bob, alice_cwd, outcomes) = escape_attempts("confined", Confinement::Landlock).await;
    for (attempt, outcome) in &outcomes {
        assert_eq!(outcome, "denied", "{attempt}");
    }
    assert!(!s.data.join("planted").exists());
    assert!(!alice_cwd.join("theirs.txt").exists());
    // What it may do: its own workspace, the system's files.
    let own = probe(
        &s.server,
        &bob,
        "probe",
        "t",
        json!({"write": ["own.txt"], "read": ["/etc/hostname"], "list": ["/usr/bin", "."]}),
    )
    .await;
    assert_eq!(own.as_object().map(|o| o.len()), Some(4));
    for (attempt, outcome) in own.as_object().expect("outcomes") {
        assert_eq!(outcome, "ok", "{attempt}");
    }
    let read_back = probe(&s.server, &bob, "probe", "t", json!({"read": ["own.txt"]})).await;
    assert_eq!(read_back, json!({"read:own.txt": "ok"}));
}

#[tokio::test]
#[ignore = "needs bwrap (Debian: bubblewrap): scripts/test.sh runs it"]
async fn under_bwrap_the_probe_reaches_nothing_either() {
    let (s, bob, _, outcomes) = escape_attempts("bwrap", Confinement::Bwrap).await;
    // Hidden (an empty directory over the data directory, another PID namespace) or
    // refused: never reached.
    for (attempt, outcome) in &outcomes {
        assert_ne!(outcome, "ok", "{attempt}");
    }
    // The daemon is not even there: another PID namespace (plain Landlock says "denied").
    let signal = &outcomes[&format!("signal:{}", std::process::id())];
    assert!(
        signal
            .as_str()
            .is_some_and(|o| o.contains("No such process")),
        "{signal}"
    );
    assert!(!s.data.join("planted").exists());
    let own = probe(&s.server, &bob, "probe", "t", json!({"write": ["own.txt"]})).await;
    assert_eq!(own, json!({"write:own.txt": "ok"}));
}

#[tokio::test]
async fn the_same_probe_unconfined_reaches_everything() {
    let (_s, _, _, outcomes) = escape_attempts("unconfined", Confinement::None).await;
    // Everything but the files that do not exist is reached: the confined probe's
    // refusals above are the confinement's doing.
    for (attempt, outcome) in &outcomes {
        // An unconfined agent gets no home of its own: there are none to list.
        if attempt.ends_with("/homes") {
            continue;
        }
        assert_eq!(outcome, "ok", "{attempt}");
    }
    let _ = std::fs::remove_file("/tmp/agui-probe-outside");
}

#[tokio::test]
async fn each_thread_works_in_its_own_workspace_and_keeps_it_across_a_restart() {
    let data = temp_dir("ws-restart");
    let start = |data: PathBuf| {
        TestServer::with(move |c| {
            c.data_dir = data.clone();
            c.agents = vec![probe_agent("probe", Confinement::Landlock, &data, None)];
        })
    };
    let server = start(data.clone()).await;
    say(&server, TOKEN, "probe", "a", "write hello.txt from a").await;
    say(&server, TOKEN, "probe", "b", "write hello.txt from b").await;
    let a = cwd_of(&say(&server, TOKEN, "probe", "a", "pwd").await);
    let b = cwd_of(&say(&server, TOKEN, "probe", "b", "pwd").await);
    assert_ne!(a, b);
    assert_eq!(
        std::fs::read_to_string(a.join("hello.txt")).expect("a"),
        "from a\n"
    );
    assert_eq!(
        std::fs::read_to_string(b.join("hello.txt")).expect("b"),
        "from b\n"
    );
    server.stop().await;
    let server = start(data.clone()).await;
    let frames = turn(&server, TOKEN, "probe", "a", "pwd").await;
    assert_eq!(
        cwd_of(&text_of(&frames)),
        a,
        "the same workspace after a restart"
    );
    let state = apply_state(&frames, None).expect("state");
    assert_eq!(state["session"].as_str().map(str::is_empty), Some(false));
    let (_, thread) = get_json(&server, "/threads/a").await;
    assert_eq!(thread["metadata"]["session"]["how"], "loaded", "{thread}");
    assert_eq!(
        std::fs::read_to_string(a.join("hello.txt")).expect("a"),
        "from a\n"
    );
}

#[tokio::test]
async fn a_turn_tells_which_files_it_changed_and_the_workspace_routes_serve_them() {
    let s = setup("ws-api", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, None)];
    })
    .await;
    let alice = token_for(&s.server, "alice").await;
    let frames = turn(&s.server, &alice, "probe", "w", "write notes.md one line").await;
    let changed: Vec<&SseFrame> = frames
        .iter()
        .filter(|f| f.kind() == "CUSTOM" && f.data["name"] == "agui.workspace.changed")
        .collect();
    assert_eq!(changed.len(), 1, "{:?}", kinds(&frames));
    assert_eq!(
        changed[0].data["value"],
        json!({"files": [{"path": "notes.md", "added": 1, "removed": 0}]})
    );
    let get = |path: &str, token: &str| {
        client()
            .get(s.server.url(path))
            .bearer_auth(token.to_owned())
            .send()
    };
    let listing: Value = get("/threads/w/workspace", &alice)
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["notes.md"]);
    let file = get("/threads/w/workspace/file?path=notes.md", &alice)
        .await
        .expect("get");
    assert_eq!(file.status(), 200);
    assert_eq!(file.text().await.expect("text"), "one line\n");
    let changes: Value = get("/threads/w/workspace/changes", &alice)
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(
        changes["changes"]["files"][0]["path"], "notes.md",
        "{changes}"
    );
    // No way out, and nobody else's.
    say(&s.server, &alice, "probe", "w", "symlink out /etc").await;
    for path in ["..", "../..", "/etc/passwd", "out/passwd", "notes.md/.."] {
        let url = format!("/threads/w/workspace/file?path={}", urlencode(path));
        let response = get(&url, &alice).await.expect("get");
        assert_eq!(response.status(), 400, "{path}");
    }
    let response = get("/threads/w/workspace?path=out", &alice)
        .await
        .expect("get");
    assert_eq!(response.status(), 400);
    let bob = token_for(&s.server, "bob").await;
    for path in [
        "/threads/w/workspace",
        "/threads/w/workspace/file?path=notes.md",
        "/threads/w/workspace/changes",
    ] {
        assert_eq!(get(path, &bob).await.expect("get").status(), 404, "{path}");
    }
}

fn urlencode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

#[tokio::test]
async fn a_fork_copies_the_workspace_and_a_delete_removes_it() {
    // The scripted agent forks a session by copying its history, kept in `state`.
    let state = temp_dir("ws-fork-state");
    let s = setup("ws-fork", move |c, d| {
        let mut agent = probe_agent("probe", Confinement::Landlock, d, None);
        if let AgentKind::Acp(acp) = &mut agent.kind {
            acp.env
                .insert("SCRIPTED_AGENT_STATE".into(), state.display().to_string());
            acp.sandbox.write = vec![state.clone()];
        }
        c.agents = vec![agent];
    })
    .await;
    say(&s.server, TOKEN, "probe", "src", "write kept.txt original").await;
    let source = cwd_of(&say(&s.server, TOKEN, "probe", "src", "pwd").await);
    let forked = s
        .server
        .post("/threads/src/fork")
        .json(&json!({"threadId": "copy"}))
        .sent()
        .await;
    assert_eq!(forked.status(), 201, "{:?}", forked.text().await);
    let copy = cwd_of(&say(&s.server, TOKEN, "probe", "copy", "pwd").await);
    assert_ne!(copy, source);
    assert_eq!(
        std::fs::read_to_string(copy.join("kept.txt")).expect("copied"),
        "original\n"
    );
    let deleted = s.server.delete("/threads/copy").sent().await;
    assert_eq!(deleted.status(), 204);
    eventually("the deleted thread's workspace is removed", || {
        !copy.exists()
    })
    .await;
    assert!(source.join("kept.txt").exists());
}

#[tokio::test]
async fn a_quota_breach_ends_the_run_with_an_error_naming_it() {
    let s = setup("ws-quota", |c, d| {
        c.agents = vec![probe_agent(
            "probe",
            Confinement::Landlock,
            d,
            Some(64 * 1024),
        )];
    })
    .await;
    say(&s.server, TOKEN, "probe", "q", "write small.txt fits").await;
    let frames = turn(&s.server, TOKEN, "probe", "q", "fill big.bin 200000").await;
    let last = frames.last().expect("frames");
    assert_eq!(last.kind(), "RUN_ERROR", "{:?}", kinds(&frames));
    assert_eq!(last.data["code"], "WORKSPACE_QUOTA");
    assert!(
        last.data["message"]
            .as_str()
            .expect("message")
            .contains("quota")
    );
    // Nothing stored is lost: the thread's transcript still holds the first turn.
    let (_, messages) = get_json(&s.server, "/threads/q/messages").await;
    let text = messages.to_string();
    assert!(text.contains("Wrote small.txt"), "{text}");
}

#[tokio::test]
async fn an_idle_session_is_closed_and_the_next_run_loads_it() {
    let state = temp_dir("ws-idle-state");
    let s = setup("ws-idle", move |c, d| {
        let mut agent = probe_agent("probe", Confinement::Landlock, d, None);
        if let AgentKind::Acp(acp) = &mut agent.kind {
            acp.session_ttl = Duration::from_millis(500);
            acp.env
                .insert("SCRIPTED_AGENT_STATE".into(), state.display().to_string());
            acp.sandbox.write = vec![state.clone()];
        }
        c.agents = vec![agent];
    })
    .await;
    say(&s.server, TOKEN, "probe", "idle", "write a.txt first").await;
    let first = cwd_of(&say(&s.server, TOKEN, "probe", "idle", "pwd").await);
    let (_, thread) = get_json(&s.server, "/threads/idle").await;
    assert_eq!(thread["metadata"]["session"]["how"], "new");
    // The session's process (one per thread) goes once the session is closed.
    let mut gone = false;
    for _ in 0..200 {
        if agent_processes(&s.server, "probe").await == 0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the idle session's process was not stopped");
    let again = cwd_of(&say(&s.server, TOKEN, "probe", "idle", "pwd").await);
    assert_eq!(again, first);
    let (_, thread) = get_json(&s.server, "/threads/idle").await;
    assert_eq!(thread["metadata"]["session"]["how"], "loaded", "{thread}");
}

/// The agent's processes, busy or idle, as `/metrics` counts them.
async fn agent_processes(server: &TestServer, agent: &str) -> u64 {
    let text = server
        .get("/metrics")
        .sent()
        .await
        .text()
        .await
        .expect("metrics");
    let label = format!("agent=\"{agent}\"");
    text.lines()
        .filter(|l| l.contains("agent_processes{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// What each kernel-door attempt runs in Python: prints `ok`, `denied` (EPERM or EACCES)
/// or `error: ...`.
const PRELUDE: &str = r#"
import ctypes, os, resource, socket
libc = ctypes.CDLL(None, use_errno=True)
def call(n, *args):
    if libc.syscall(n, *args) == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
def checked(r):
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r
def report(f):
    try:
        f()
        print("ok")
    except PermissionError:
        print("denied")
    except OSError as e:
        print("error: %s" % e)
"#;

/// The kernel's doors that Landlock alone leaves open, as Python: `HOST` and `PORT` are
/// the daemon's address, `PID` its pid, `OTHER` another principal's agent's pid.
const KERNEL_DOORS: [(&str, &str); 27] = [
    // MPTCP passes Landlock's TCP rules; the other families are not needed at all.
    (
        "mptcp-daemon",
        "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262); s.settimeout(2); s.connect(('HOST', PORT))",
    ),
    (
        "sctp",
        "socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132)",
    ),
    (
        "udplite",
        "socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 136)",
    ),
    ("vsock", "socket.socket(40, socket.SOCK_STREAM, 0)"),
    ("alg", "socket.socket(38, socket.SOCK_SEQPACKET, 0)"),
    (
        "netlink-audit",
        "socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9)",
    ),
    ("unix-pair-inet", "socket.socketpair(socket.AF_INET)"),
    // SCTP (or DCCP) by socket type rather than protocol.
    (
        "seqpacket-inet",
        "socket.socket(socket.AF_INET, socket.SOCK_SEQPACKET, 0)",
    ),
    // A set-user-ID file of the daemon's user (root, perhaps), for anyone to run.
    (
        "setuid-bit",
        "open('suid', 'w').close(); os.chmod('suid', 0o4755)",
    ),
    // Limits, priority and CPUs of the daemon and of another principal's agent.
    (
        "prlimit-daemon",
        "resource.prlimit(PID, resource.RLIMIT_NOFILE)",
    ),
    (
        "prlimit-other",
        "resource.prlimit(OTHER, resource.RLIMIT_CPU)",
    ),
    (
        "renice-daemon",
        "os.setpriority(os.PRIO_PROCESS, PID, os.getpriority(os.PRIO_PROCESS, PID))",
    ),
    ("renice-user", "os.setpriority(os.PRIO_USER, 0, 0)"),
    ("renice-group", "os.setpriority(os.PRIO_PGRP, 0, 0)"),
    (
        "affinity-daemon",
        "os.sched_setaffinity(PID, os.sched_getaffinity(PID))",
    ),
    (
        "affinity-other",
        "os.sched_setaffinity(OTHER, os.sched_getaffinity(OTHER))",
    ),
    // SysV IPC, shared with every process of the daemon's IPC namespace.
    ("shm", "checked(libc.shmget(0, 4096, 0o1600))"),
    ("msgq", "checked(libc.msgget(0, 0o1600))"),
    ("sem", "checked(libc.semget(0, 1, 0o1600))"),
    // A port bound by `listen` past the bind rule.
    ("implicit-bind", "socket.socket().listen(1)"),
    // New namespaces, io_uring, keyrings, bpf, perf, userfaultfd, process_vm_readv.
    ("unshare-user", "checked(libc.unshare(0x10000000))"),
    ("io-uring", "call(425, 1, ctypes.create_string_buffer(120))"),
    ("keyctl", "call(250, 0, -3, 0)"),
    ("bpf", "call(321, 0, ctypes.create_string_buffer(128), 128)"),
    (
        "perf",
        "call(298, ctypes.create_string_buffer(128), 0, -1, -1, 0)",
    ),
    ("userfaultfd", "call(323, 0)"),
    ("process-vm-readv", "call(310, OTHER, 0, 0, 0, 0, 0)"),
];

/// The probe's plan for [`KERNEL_DOORS`], tried on the daemon (`daemon`: its address,
/// `pid`) and on another principal's agent (`other`).
fn kernel_attempts(daemon: std::net::SocketAddr, pid: u32, other: u32) -> Value {
    let run: Vec<Value> = KERNEL_DOORS
        .iter()
        .map(|(label, code)| {
            let code = code
                .replace("HOST", &daemon.ip().to_string())
                .replace("PORT", &daemon.port().to_string())
                .replace("OTHER", &other.to_string())
                .replace("PID", &pid.to_string());
            json!([label, format!("{PRELUDE}\nreport(lambda: exec({code:?}))")])
        })
        .collect();
    json!({ "run": run })
}

/// Alice's agent tells its pid; Bob's agent tries every kernel door on it and on the
/// daemon. The outcomes by attempt.
async fn kernel_door_attempts(
    tag: &str,
    confinement: Confinement,
) -> serde_json::Map<String, Value> {
    let s = setup(tag, move |c, d| {
        c.agents = vec![probe_agent("probe", confinement, d, None)];
    })
    .await;
    let (alice, bob) = (
        token_for(&s.server, "alice").await,
        token_for(&s.server, "bob").await,
    );
    let pid = probe(
        &s.server,
        &alice,
        "probe",
        "t",
        json!({"run": [["pid", "import os; print(os.getppid())"]]}),
    )
    .await;
    let other: u32 = pid["run:pid"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("alice's agent's pid: {pid}"));
    let plan = kernel_attempts(s.server.addr, std::process::id(), other);
    let outcomes = probe(&s.server, &bob, "probe", "t", plan).await;
    let Value::Object(outcomes) = outcomes else {
        panic!("outcomes: {outcomes}");
    };
    assert_eq!(
        outcomes.len(),
        KERNEL_DOORS.len(),
        "every attempt reported: {outcomes:?}"
    );
    outcomes
}

#[tokio::test]
async fn a_confined_agent_finds_every_kernel_door_closed() {
    let mut outcomes = kernel_door_attempts("doors", Confinement::Landlock).await;
    // The launcher made the agent a network of its own: a port bound by `listen` is there,
    // where no one else is (`a_confined_agent_has_a_network_of_its_own`).
    assert_eq!(outcomes.remove("run:implicit-bind"), Some(json!("ok")));
    for (attempt, outcome) in &outcomes {
        assert_eq!(outcome, "denied", "{attempt}");
    }
}

#[tokio::test]
#[ignore = "needs bwrap (Debian: bubblewrap): scripts/test.sh runs it"]
async fn under_bwrap_every_kernel_door_is_closed_too() {
    let mut outcomes = kernel_door_attempts("doors-bwrap", Confinement::Bwrap).await;
    // A port bound by `listen` is in the agent's own network namespace, where no one else
    // is (`under_bwrap_the_agent_has_a_network_of_its_own`).
    assert_eq!(outcomes.remove("run:implicit-bind"), Some(json!("ok")));
    // Refused, or (the daemon and the other agent in no PID namespace of its own) not
    // even there to ask about.
    for (attempt, outcome) in &outcomes {
        let absent = outcome
            .as_str()
            .is_some_and(|o| o.contains("No such process"));
        assert!(outcome == "denied" || absent, "{attempt}: {outcome}");
    }
}

#[tokio::test]
async fn unconfined_the_kernel_doors_are_open() {
    let outcomes = kernel_door_attempts("doors-open", Confinement::None).await;
    // What the kernel itself allows a root process: the refusals above are the filter's.
    for attempt in [
        "mptcp-daemon",
        "prlimit-daemon",
        "prlimit-other",
        "renice-daemon",
        "affinity-daemon",
        "affinity-other",
        "shm",
        "msgq",
        "sem",
        "implicit-bind",
        "unix-pair-inet",
        "seqpacket-inet",
        "setuid-bit",
    ] {
        let outcome = &outcomes[&format!("run:{attempt}")];
        // socketpair(AF_INET) is refused by the kernel itself (not supported); anything
        // but the filter's EPERM shows the call got through to the kernel.
        assert_ne!(outcome, "denied", "{attempt}: {outcome}");
    }
}

/// `/healthz` asked every 50 ms until `stop`: the slowest answer, and whether every one
/// came.
async fn watch_health(url: String, stop: tokio_util::sync::CancellationToken) -> (Duration, bool) {
    let mut slowest = Duration::ZERO;
    let mut all = true;
    while !stop.is_cancelled() {
        let asked = std::time::Instant::now();
        let answered =
            tokio::time::timeout(Duration::from_secs(10), client().get(&url).send()).await;
        all &= matches!(answered, Ok(Ok(ref r)) if r.status() == 200);
        slowest = slowest.max(asked.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (slowest, all)
}

#[tokio::test]
async fn a_memory_hog_and_a_fork_bomb_hit_their_limits_and_another_principal_goes_on() {
    if agui_serve::confine::cgroup::status().is_err() {
        // The host gives no control group to the daemon: the limits cannot be had here,
        // and the daemon says so at start (tests/binary.rs checks the warning).
        panic!(
            "no writable cgroup on this host: {:?}",
            agui_serve::confine::cgroup::status()
        );
    }
    let s = setup("limits", |c, d| {
        let mut agent = probe_agent("probe", Confinement::Landlock, d, None);
        if let agui_serve::config::AgentKind::Acp(acp) = &mut agent.kind {
            acp.sandbox.limits.memory_mib = 96;
            acp.sandbox.limits.pids = 48;
        }
        c.agents = vec![agent];
    })
    .await;
    let (alice, bob) = (
        token_for(&s.server, "alice").await,
        token_for(&s.server, "bob").await,
    );
    // The fleet stream, followed from before the attack: each limit hit shows there.
    let fleet = client()
        .get(s.server.url("/fleet/stream"))
        .bearer_auth(TOKEN)
        .header("accept", "text/event-stream")
        .sent()
        .await;
    assert_eq!(fleet.status(), 200);
    let mut fleet = SseReader::new(fleet);
    let stop = tokio_util::sync::CancellationToken::new();
    let health = tokio::spawn({
        let url = s.server.url("/healthz");
        let stop = stop.clone();
        async move { watch_health(url, stop).await }
    });
    // The fork bomb: processes until the kernel refuses one; the limit, not the machine.
    let bomb = "import os, time\nn = 0\ntry:\n    while n < 2000:\n        if os.fork() == 0:\n            time.sleep(5); os._exit(0)\n        n += 1\n    print('ok %d' % n)\nexcept OSError as e:\n    print('refused after %d: %s' % (n, e))";
    let plan = json!({"run": [["bomb", bomb]]});
    let frames = turn(&s.server, &bob, "probe", "b1", &format!("probe {plan}")).await;
    let forks = text_of(&frames);
    assert!(forks.contains("refused after"), "{forks}");
    let last = frames.last().expect("frames");
    assert_eq!(last.kind(), "RUN_ERROR", "{forks}");
    assert_eq!(last.data["code"], "AGENT_LIMIT");
    let message = last.data["message"].as_str().expect("message");
    assert!(message.contains("process limit (48)"), "{message}");
    // The memory hog: the agent itself, killed at its limit, the run ended naming it.
    let frames = turn(&s.server, &bob, "probe", "b2", "hog 400").await;
    let last = frames.last().expect("frames");
    assert_eq!(last.kind(), "RUN_ERROR", "{}", text_of(&frames));
    let message = last.data["message"].as_str().expect("message");
    assert!(message.contains("memory limit (96 MiB)"), "{message}");
    // Alice's runs go on meanwhile and after.
    assert_eq!(
        say(&s.server, &alice, "probe", "a", "write after.txt fine").await,
        "Wrote after.txt"
    );
    // The document the stream describes, patch by patch, until both limits are in it.
    let mut doc = Value::Null;
    let hit =
        |doc: &Value, limit: &str| doc["agents"]["probe"]["breaches"][limit].as_u64() >= Some(1);
    while !(hit(&doc, "memory") && hit(&doc, "processes")) {
        let frame = tokio::time::timeout(Duration::from_secs(10), fleet.next())
            .await
            .unwrap_or_else(|_| panic!("no breaches in the fleet stream: {doc}"))
            .expect("the fleet stream goes on");
        match frame.kind() {
            "STATE_SNAPSHOT" => doc = frame.data["snapshot"].clone(),
            "STATE_DELTA" => {
                let patch: json_patch::Patch =
                    serde_json::from_value(frame.data["delta"].clone()).expect("a patch");
                json_patch::patch(&mut doc, &patch).expect("the patch applies");
            }
            _ => {}
        }
    }
    stop.cancel();
    let (slowest, all) = health.await.expect("health watcher");
    assert!(all, "a /healthz went unanswered during the attack");
    eprintln!("slowest /healthz during the attack: {slowest:?} (fork bomb: {forks})");
}

/// Appends 8 KiB to `bg.bin` every 100 ms for 20 s from a process of its own session
/// (out of the agent's process group, its output let go), and returns at once.
const BACKGROUND_WRITER: &str = "import os, time
if os.fork() == 0:
    os.setsid()
    null = os.open('/dev/null', os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    for _ in range(200):
        with open('bg.bin', 'ab') as f:
            f.write(b'x' * 8192)
        time.sleep(0.1)
    os._exit(0)
print('ok')";

#[tokio::test]
async fn the_quota_counts_the_agent_home_and_stops_a_writer_between_turns() {
    const QUOTA: u64 = 256 * 1024;
    let s = setup("quota-home", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, Some(QUOTA))];
    })
    .await;
    let (alice, carol) = (
        token_for(&s.server, "alice").await,
        token_for(&s.server, "carol").await,
    );
    // Alice writes her home, not her workspace: the quota counts it.
    let fill_home = "import os\nopen(os.path.join(os.environ['HOME'], 'blob'), 'wb').write(b'x' * 400000)\nprint('ok')";
    let frames = turn(
        &s.server,
        &alice,
        "probe",
        "h",
        &format!("probe {}", json!({"run": [["home", fill_home]]})),
    )
    .await;
    let last = frames.last().expect("frames");
    assert_eq!(last.kind(), "RUN_ERROR", "{}", text_of(&frames));
    assert_eq!(last.data["code"], "WORKSPACE_QUOTA");
    // Carol's turn leaves a writer behind and ends within the quota.
    let cwd = cwd_of(&say(&s.server, &carol, "probe", "w", "pwd").await);
    let started = probe(
        &s.server,
        &carol,
        "probe",
        "w",
        json!({"run": [["writer", BACKGROUND_WRITER]]}),
    )
    .await;
    assert_eq!(started["run:writer"], "ok");
    // Until the file stops growing: stopped at the quota, not at the writer's own end
    // (20 s, 1.6 MB).
    let size = || std::fs::metadata(cwd.join("bg.bin")).map_or(0, |m| m.len());
    let mut last_size = size();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = size();
        if now == last_size && now > QUOTA {
            break;
        }
        last_size = now;
    }
    assert!(
        last_size < 1024 * 1024,
        "the writer went on to {last_size} bytes"
    );
    // Nothing stored is lost, and the next turn says the workspace is over its quota.
    let frames = turn(&s.server, &carol, "probe", "w", "pwd").await;
    let last = frames.last().expect("frames");
    assert_eq!(last.kind(), "RUN_ERROR", "{}", text_of(&frames));
    assert_eq!(last.data["code"], "WORKSPACE_QUOTA");
    let messages = client()
        .get(s.server.url("/threads/w/messages"))
        .bearer_auth(&carol)
        .sent()
        .await
        .text()
        .await
        .expect("messages");
    assert!(messages.contains("Cwd:"), "{messages}");
}

#[tokio::test]
async fn a_confined_agent_has_a_network_of_its_own() {
    network_of_its_own("netns", Confinement::Landlock).await;
}

#[tokio::test]
#[ignore = "needs bwrap (Debian: bubblewrap): scripts/test.sh runs it"]
async fn under_bwrap_the_agent_has_a_network_of_its_own() {
    network_of_its_own("netns-bwrap", Confinement::Bwrap).await;
}

/// An agent confined as `confinement` reaches the host's loopback ports it is allowed,
/// through the daemon, and nothing else of the host's network; another agent that finds
/// its forwarder's socket is not served.
async fn network_of_its_own(tag: &str, confinement: Confinement) {
    // A service on the host's loopback that the agent may reach, and one it may not.
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = allowed.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in allowed.incoming().flatten() {
            let mut conn = conn;
            let _ = std::io::Write::write_all(&mut conn, b"hello from the host");
        }
    });
    // A host service on a pathname socket under `/run`, as D-Bus or a container engine has.
    let host_socket = PathBuf::from(format!("/run/agui-probe-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&host_socket);
    let host_service = std::os::unix::net::UnixListener::bind(&host_socket).expect("/run socket");
    std::thread::spawn(move || {
        for conn in host_service.incoming().flatten() {
            let mut conn = conn;
            let _ = std::io::Write::write_all(&mut conn, b"hello from /run");
        }
    });
    let s = setup(tag, move |c, d| {
        let mut agent = probe_agent("probe", confinement, d, None);
        if let AgentKind::Acp(acp) = &mut agent.kind {
            acp.sandbox.connect = vec![port];
        }
        // Another agent beside it.
        let plain = probe_agent("plain", Confinement::Landlock, d, None);
        c.agents = vec![agent, plain];
    })
    .await;
    let bob = token_for(&s.server, "bob").await;
    let read = format!(
        "import socket\ns = socket.create_connection(('127.0.0.1', {port}), 5)\nprint(s.recv(100).decode())"
    );
    // Straight to the daemon's end, past the forwarder. (Under bwrap the socket is bound into
    // the sandbox's `/tmp`; a launcher's own forwarder reaches it on the host, where the
    // agent finds it too, once the agent has started.)
    let warm = probe(&s.server, &bob, "probe", "t", json!({})).await;
    assert!(warm.is_object(), "{warm}");
    let sockets: Vec<PathBuf> = std::fs::read_dir(s.data.join("run"))
        .expect("the forwarders' sockets")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(sockets.len(), 1, "{sockets:?}");
    let inside = match confinement {
        Confinement::Bwrap => PathBuf::from("/tmp/.agui-serve-forward.sock"),
        _ => sockets[0].clone(),
    };
    // It names the allowed port, whose service answers at once: without the forwarder's
    // key (which the agent never sees) it is dropped unanswered.
    let direct = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('{}')\n    s.sendall(b'{}\\n')\n    print('open' if s.recv(100) else 'closed')\nexcept OSError as e:\n    print('error: %s' % e)",
        inside.display(),
        port
    );
    let outcomes = probe(
        &s.server,
        &bob,
        "probe",
        "t",
        json!({
            "connect": [s.server.addr.to_string()],
            "run": [
                ["netns", "import os; print(os.readlink('/proc/self/ns/net'))"],
                ["key", "import os; print(os.environ.get('AGUI_FORWARD_KEY', 'none'))"],
                ["allowed", read],
                ["direct", direct],
                ["run-socket", unix_ask(&host_socket, None)],
            ],
        }),
    )
    .await;
    let ours = std::fs::read_link("/proc/self/ns/net").expect("our network namespace");
    assert_ne!(
        outcomes["run:netns"].as_str(),
        Some(ours.display().to_string().as_str()),
        "{outcomes}"
    );
    // The allowed port comes through the daemon; the daemon's own port is not there.
    assert_eq!(outcomes["run:allowed"], "hello from the host", "{outcomes}");
    assert_eq!(outcomes["run:key"], "none", "{outcomes}");
    let daemon = &outcomes[&format!("connect:{}", s.server.addr)];
    assert_ne!(daemon, "ok", "{outcomes}");
    let direct = outcomes["run:direct"].as_str().expect("direct");
    assert!(
        direct == "closed" || direct.starts_with("error"),
        "{outcomes}"
    );
    // The host's sockets under `/run` are not there (bwrap's fresh `/run`; Landlock does not
    // govern connecting to a pathname socket).
    if confinement == Confinement::Bwrap {
        let run_socket = outcomes["run:run-socket"].as_str().expect("run socket");
        assert!(run_socket.contains("No such file"), "{outcomes}");
    }
    // Another agent that finds the forwarder's socket on the host (pathname sockets pass
    // Landlock) is not served.
    let from_outside = probe(
        &s.server,
        &bob,
        "plain",
        "u",
        json!({"run": [["forwarder", unix_ask(&sockets[0], Some(port))]]}),
    )
    .await;
    // (Dropped unanswered: closed, reset or a broken pipe, as the timing falls; never the
    // service behind it.)
    let answer = from_outside["run:forwarder"].as_str().expect("answer");
    assert!(
        answer == "closed" || answer.starts_with("error: [Errno"),
        "{from_outside}"
    );
    let _ = std::fs::remove_file(&host_socket);
}

#[tokio::test]
async fn an_agent_that_may_write_the_repository_cannot_change_its_config_or_hooks() {
    let repo = temp_dir("protected-repo");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-C"])
            .arg(&repo)
            .args(args)
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(repo.join("a.txt"), "a\n").expect("write");
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "init"]);
    let r = repo.clone();
    let s = setup("protected", move |c, d| {
        let mut agent = probe_agent("probe", Confinement::Landlock, d, None);
        if let AgentKind::Acp(acp) = &mut agent.kind {
            if let Some(workspace) = &mut acp.workspace {
                workspace.source = Source::Git {
                    repo: r.clone(),
                    reference: None,
                };
            }
            acp.sandbox.write = vec![r.clone()];
        }
        c.agents = vec![agent];
    })
    .await;
    let bob = token_for(&s.server, "bob").await;
    let git_dir = repo.join(".git");
    let path = |rel: &str| git_dir.join(rel).display().to_string();
    let outcomes = probe(
        &s.server,
        &bob,
        "probe",
        "t",
        json!({"write": [
            path("config"),
            path("hooks/post-checkout"),
            path("info/attributes"),
            path("HEAD"),
            path("commondir"),
            path("objects/probe"),
        ]}),
    )
    .await;
    for kept in [
        "config",
        "hooks/post-checkout",
        "info/attributes",
        "HEAD",
        "commondir",
    ] {
        assert_eq!(
            outcomes[&format!("write:{}", path(kept))],
            "denied",
            "{outcomes}"
        );
    }
    // The rest stays writable: committing works.
    assert_eq!(
        outcomes[&format!("write:{}", path("objects/probe"))],
        "ok",
        "{outcomes}"
    );
}

/// Python that connects to the UNIX socket `path`, sends `port` as a line when given, and
/// prints what comes back (`closed` for nothing) or the error.
fn unix_ask(path: &Path, port: Option<u16>) -> String {
    let send = port.map_or(String::new(), |p| format!("s.sendall(b'{p}\\n')\n    "));
    format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(5)\ntry:\n    s.connect('{}')\n    {send}print(s.recv(100).decode() or 'closed')\nexcept OSError as e:\n    print('error: %s' % e)",
        path.display()
    )
}

#[tokio::test]
async fn what_an_agent_leaves_running_ends_with_it() {
    let s = setup("leftovers", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, None)];
    })
    .await;
    let cwd = cwd_of(&say(&s.server, TOKEN, "probe", "l", "pwd").await);
    let started = probe(
        &s.server,
        TOKEN,
        "probe",
        "l",
        json!({"run": [["writer", BACKGROUND_WRITER]]}),
    )
    .await;
    assert_eq!(started["run:writer"], "ok");
    // The agent exits on its own; the writer it left, in a session of its own, goes too.
    let frames = turn(&s.server, TOKEN, "probe", "l", "crash").await;
    assert_eq!(frames.last().map(SseFrame::kind), Some("RUN_ERROR"));
    let size = || std::fs::metadata(cwd.join("bg.bin")).map_or(0, |m| m.len());
    let mut last_size = size();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = size();
        if now == last_size {
            break;
        }
        last_size = now;
    }
    // The writer's own end would be 20 s and 1.6 MB.
    assert!(
        last_size < 400 * 1024,
        "the writer went on to {last_size} bytes"
    );
}
