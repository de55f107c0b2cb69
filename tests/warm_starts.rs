//! Warm starts with the scripted ACP agent (`examples/scripted_acp_agent.rs`), whose request
//! log (`SCRIPTED_AGENT_LOG`) says which process got `initialize`, `session/new`,
//! `session/load` and `session/prompt`, and in which order: a new thread's first turn on a
//! spare sends only its prompt, the spare is replaced, its session is the thread's (its
//! workspace, its MCP endpoint, the agent's session defaults, as a fresh session's), no
//! spares means nothing made, spares stop after their TTL and are kept for the most
//! recently seen principals only, and a restarted daemon loads the recent threads' sessions
//! before their turns come (and asks once for a session the agent will not load).

mod support;

use std::path::Path;
use std::time::Duration;

use agui_serve::config::{AcpConfig, AgentConfig, AgentKind, Hitl, Permissions, Warm};
use agui_serve::confine::Confinement;
use agui_serve::workspace::{Source, Unit, WorkspaceConfig};
use serde_json::{Value, json};
use support::*;

/// The scripted agent logging to `log`, with `spares` spares; `workspaces`: a workspace per
/// thread under `data` and the agent confined (a process per thread), else one shared
/// directory (one process per principal).
fn agent(name: &str, spares: usize, log: &Path, workspaces: Option<&Path>) -> AgentConfig {
    let mut config = AcpConfig::new(vec![scripted_agent().display().to_string()]);
    config.permissions = Permissions::Allow;
    config
        .env
        .insert("SCRIPTED_AGENT_LOG".to_owned(), log.display().to_string());
    config.sandbox.write = vec![log.parent().expect("log dir").to_owned()];
    if let Some(data) = workspaces {
        config.confinement = Some(Confinement::Landlock);
        config.workspace = Some(WorkspaceConfig {
            source: Source::Empty,
            root: data.join("workspaces"),
            quota: None,
            unit: Unit::Thread,
            checkpoints: agui_serve::workspace::DEFAULT_CHECKPOINTS,
        });
    }
    config.warm = Warm {
        spares,
        ..Warm::default()
    };
    AgentConfig {
        name: name.to_owned(),
        description: "scripted".to_owned(),
        hitl: Hitl::Tool,
        multitask: Default::default(),
        history: Default::default(),
        budget: None,
        kind: AgentKind::Acp(config),
    }
}

/// One line of the agent's request log, split on spaces.
#[derive(Debug, Clone, PartialEq)]
struct Logged(Vec<String>);

impl Logged {
    fn what(&self) -> &str {
        &self.0[0]
    }
    /// The process of an `initialize`, a `new`, a `load` or a `prompt`.
    fn pid(&self) -> &str {
        if self.what() == "initialize" {
            &self.0[1]
        } else {
            &self.0[2]
        }
    }
    /// The session of a `new`, `load` or `prompt`.
    fn session(&self) -> &str {
        &self.0[1]
    }
    /// The `cwd` of a `new`.
    fn cwd(&self) -> &str {
        &self.0[3]
    }
}

fn read_log(log: &Path) -> Vec<Logged> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|line| Logged(line.split(' ').map(str::to_owned).collect()))
        .collect()
}

/// Waits (on the agent's own log, up to a minute) until `done` holds of it.
async fn wait_log(log: &Path, what: &str, done: impl Fn(&[Logged]) -> bool) -> Vec<Logged> {
    for _ in 0..1200 {
        let lines = read_log(log);
        if done(&lines) {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{what}: the agent's log never showed it: {:?}",
        read_log(log)
    );
}

/// Waits (up to a minute) until `agent` has `n` spares ready, as the agents route tells
/// the operator.
async fn wait_spares(server: &TestServer, agent: &str, n: u64) {
    let mut seen = Value::Null;
    for _ in 0..1200 {
        let (status, body) = get_json(server, "/agents").await;
        assert_eq!(status, 200);
        seen = body["agents"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["name"] == agent))
            .map(|e| e["spares"].clone())
            .unwrap_or_default();
        if seen == json!(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{agent}: {n} spares never ready (last seen {seen})");
}

fn count(lines: &[Logged], what: &str) -> usize {
    lines.iter().filter(|l| l.what() == what).count()
}

async fn run(server: &TestServer, agent: &str, body: &Value) -> Vec<SseFrame> {
    let r = post_run(server, agent, body).await;
    assert_eq!(r.status(), 200);
    let frames = SseReader::new(r).collect().await;
    assert_valid_segment(&frames);
    frames
}

/// A conversation's next turn: every message so far and a new user message.
fn next_turn(thread: &str, n: usize, history: &mut Vec<Value>, text: &str) -> Value {
    history.push(json!({"id": format!("{thread}-u{n}"), "role": "user", "content": text}));
    json!({"threadId": thread, "runId": format!("{thread}-r{n}"), "protocolVersion": "1.0",
        "messages": history})
}

fn session_of(frames: &[SseFrame]) -> String {
    apply_state(frames, None).expect("state")["session"]
        .as_str()
        .expect("session")
        .to_owned()
}

#[tokio::test]
async fn a_new_threads_first_turn_takes_a_spare_made_before_it_and_keeps_its_workspace() {
    let scratch = temp_dir("warm-spare");
    let log = scratch.join("agent.log");
    let data = temp_dir("warm-spare-data");
    let (l, d) = (log.clone(), data.clone());
    let configure = move |c: &mut agui_serve::config::Config| {
        c.data_dir = d.clone();
        c.agents = vec![agent("warm", 1, &l, Some(&d))];
    };
    let server = TestServer::with(configure.clone()).await;

    // The spare: a process initialized and a session made, before any request.
    wait_spares(&server, "warm", 1).await;
    let before = read_log(&log);
    assert_eq!(count(&before, "new"), 1, "{before:?}");
    assert_eq!(count(&before, "initialize"), 1, "{before:?}");
    let spare = before
        .iter()
        .find(|l| l.what() == "new")
        .expect("new")
        .clone();
    assert!(
        spare.cwd().contains("/threads/_spare."),
        "made in a spare workspace: {spare:?}"
    );

    let mut history = Vec::new();
    let frames = run(&server, "warm", &next_turn("w1", 1, &mut history, "pwd")).await;
    assert_eq!(session_of(&frames), spare.session(), "the spare's session");
    assert_eq!(text_of(&frames), format!("Cwd: {}", spare.cwd()));
    let thread: Value = get_json(&server, "/threads/w1").await.1;
    assert_eq!(thread["metadata"]["session"]["how"], "new");
    // What the thread's process got once the request came: its prompt, nothing else.
    let after = read_log(&log);
    let since: Vec<&Logged> = after[before.len()..]
        .iter()
        .filter(|l| l.pid() == spare.pid())
        .collect();
    assert_eq!(
        since.iter().map(|l| l.what()).collect::<Vec<_>>(),
        ["prompt"],
        "no initialize or session/new on the thread's process after the request: {after:?}"
    );
    assert_eq!(since[0].session(), spare.session());

    // The spare is replaced in the background: another process, another session.
    let replaced = wait_log(&log, "the replacement", |l| count(l, "new") == 2).await;
    wait_spares(&server, "warm", 1).await;
    let second = replaced.iter().rfind(|l| l.what() == "new").expect("new");
    assert_ne!(second.pid(), spare.pid());
    assert_ne!(second.cwd(), spare.cwd(), "a workspace of its own");

    // The workspace the thread adopted is its workspace: the agent's files are there.
    let frames = run(
        &server,
        "warm",
        &next_turn("w1", 2, &mut history, "write note.txt kept"),
    )
    .await;
    assert_eq!(text_of(&frames), "Wrote note.txt");
    let file = server
        .get("/threads/w1/workspace/file?path=note.txt")
        .sent()
        .await;
    assert_eq!(file.status(), 200);
    assert_eq!(file.text().await.expect("text"), "kept\n");
    server.stop().await;

    // After a restart the thread's session is loaded in that same workspace.
    let server = TestServer::with(configure).await;
    let frames = run(&server, "warm", &next_turn("w1", 3, &mut history, "pwd")).await;
    assert_eq!(session_of(&frames), spare.session(), "the same session");
    assert_eq!(text_of(&frames), format!("Cwd: {}", spare.cwd()));
    let lines = read_log(&log);
    assert!(
        lines
            .iter()
            .any(|l| l.what() == "load" && l.session() == spare.session()),
        "{lines:?}"
    );
    let file = server
        .get("/threads/w1/workspace/file?path=note.txt")
        .sent()
        .await;
    assert_eq!(file.text().await.expect("text"), "kept\n");

    // Deleting the thread removes the adopted workspace.
    assert_eq!(server.delete("/threads/w1").sent().await.status(), 204);
    assert!(!Path::new(spare.cwd()).exists(), "removed with its thread");
    server.stop().await;
}

#[tokio::test]
async fn a_spare_session_is_what_a_fresh_one_would_be_with_the_frontend_tools_of_its_run() {
    let scratch = temp_dir("warm-same");
    let (fresh_log, spare_log) = (scratch.join("fresh.log"), scratch.join("spare.log"));
    let (f, s) = (fresh_log.clone(), spare_log.clone());
    let server = TestServer::with(move |c| {
        let mut agents = vec![agent("fresh", 0, &f, None), agent("spare", 1, &s, None)];
        for agent in &mut agents {
            if let AgentKind::Acp(acp) = &mut agent.kind {
                acp.session_defaults = json!({"mode": "plan", "configOptions": {"model": "smart"}});
            }
        }
        c.agents = agents;
    })
    .await;
    wait_spares(&server, "spare", 1).await;
    let before = read_log(&spare_log);
    let made = before
        .iter()
        .find(|l| l.what() == "new")
        .expect("new")
        .clone();

    // The same first turn on each: the same words and the same state, but the session id.
    let mut views = Vec::new();
    for name in ["fresh", "spare"] {
        let frames = run(&server, name, &run_body(name, "r1", "settings")).await;
        assert_eq!(
            text_of(&frames),
            "Mode: plan; model: smart; fast_apply: false; sets: 1",
            "{name}"
        );
        let mut view = apply_state(&frames, None).expect("state");
        view["session"] = Value::Null;
        view["agent"] = Value::Null;
        views.push(view);
    }
    assert_eq!(views[0], views[1]);
    let after = read_log(&spare_log);
    assert_eq!(
        count(&after[before.len()..], "prompt"),
        1,
        "the spare's session took the prompt: {after:?}"
    );
    assert!(
        after[before.len()..]
            .iter()
            .filter(|l| l.what() == "prompt")
            .all(|l| l.session() == made.session()),
        "{after:?}"
    );

    // Its MCP endpoint serves the frontend tools of the run that took it.
    let tools =
        json!([{"name": "chart", "description": "draws", "parameters": {"type": "object"}}]);
    let user = json!({"id": "m-u", "role": "user", "content": "mcp chart {\"kind\":\"bar\"}"});
    let body = json!({"threadId": "m", "runId": "m1", "protocolVersion": "1.0", "tools": tools, "messages": [user]});
    wait_log(&spare_log, "the replacement", |l| count(l, "new") == 2).await;
    wait_spares(&server, "spare", 1).await;
    let replaced = read_log(&spare_log);
    let taken = replaced
        .iter()
        .rfind(|l| l.what() == "new")
        .expect("new")
        .clone();
    let frames = run(&server, "spare", &body).await;
    assert_eq!(session_of(&frames), taken.session());
    let start = frames
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_START")
        .expect("the frontend call");
    assert_eq!(start.data["toolCallName"], "chart");
    assert!(
        frames.last().expect("terminal").data["outcome"]["pendingToolCallIds"]
            .as_array()
            .is_some_and(|ids| ids.len() == 1),
        "{:?}",
        kinds(&frames)
    );
    server.stop().await;
}

#[tokio::test]
async fn no_spares_start_nothing() {
    let scratch = temp_dir("warm-none");
    let (cold_log, warm_log) = (scratch.join("cold.log"), scratch.join("warm.log"));
    let (c0, w0) = (cold_log.clone(), warm_log.clone());
    // Both agents are warmed up at start, "cold" first: once "warm" has its spare, "cold"
    // had its chance.
    let server = TestServer::with(move |c| {
        c.agents = vec![agent("cold", 0, &c0, None), agent("warm", 1, &w0, None)];
    })
    .await;
    wait_spares(&server, "warm", 1).await;
    assert!(read_log(&cold_log).is_empty(), "no spare, no process");
    let (_, agents) = get_json(&server, "/agents").await;
    assert!(
        agents["agents"][0].get("spares").is_none(),
        "an agent without spares shows none: {agents}"
    );
    // Its first turn starts everything (the log works for it).
    run(&server, "cold", &run_body("c", "r1", "hello")).await;
    let lines = read_log(&cold_log);
    assert_eq!(
        lines.iter().map(Logged::what).collect::<Vec<_>>(),
        ["initialize", "new", "prompt"]
    );
    server.stop().await;
}

#[tokio::test]
async fn spares_stop_after_their_ttl() {
    use agui_serve::agent::Agent;
    use agui_serve::agent::acp::AcpBackend;
    let scratch = temp_dir("warm-ttl");
    let log = scratch.join("agent.log");
    let data = temp_dir("warm-ttl-data");
    // A process per thread: a spare is a process of its own, with a workspace of its own.
    let AgentKind::Acp(mut config) = agent("ttl", 1, &log, Some(&data)).kind else {
        panic!("acp config expected");
    };
    config.warm.spare_ttl = Duration::from_secs(600);
    let mut host = agui_serve::agent::acp::AgentHost::new(&data);
    host.launcher = launcher();
    let backend = std::sync::Arc::new(AcpBackend::new("ttl", config, host));
    let mut agents: std::collections::BTreeMap<String, std::sync::Arc<dyn Agent>> =
        Default::default();
    agents.insert("ttl".into(), backend.clone());
    let _runtime = agui_serve::runtime::Runtime::new(
        agents,
        agui_serve::runtime::RuntimeOptions::new(4),
        agui_serve::store::Store::open(&temp_dir("warm-ttl-db")).expect("store"),
    );
    // The spare is made on real time (a real process answers); its TTL is paused time.
    for _ in 0..1200 {
        if backend.spares_ready() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(backend.spares_ready(), 1, "the spare was never made");
    assert_eq!(backend.process_count(), 1);
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(590)).await;
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert_eq!(backend.spares_ready(), 1, "still within its TTL at 590 s");
    tokio::time::advance(Duration::from_secs(200)).await;
    let mut stopped = false;
    for _ in 0..200 {
        tokio::task::yield_now().await;
        if backend.spares_ready() == 0 && backend.process_count() == 0 {
            stopped = true;
            break;
        }
    }
    assert!(stopped, "the spare outlived its TTL");
    tokio::time::resume();
    backend.shutdown().await;
    // Made once, never again (nobody has been seen since), and its workspace removed.
    let made = read_log(&log);
    assert_eq!(count(&made, "new"), 1, "{made:?}");
    let spare = made.iter().find(|l| l.what() == "new").expect("new");
    assert!(!Path::new(spare.cwd()).exists(), "{spare:?}");
}

#[tokio::test]
async fn a_restarted_daemon_loads_the_recent_threads_sessions_before_their_turns() {
    let scratch = temp_dir("warm-restart");
    let log = scratch.join("agent.log");
    let data = temp_dir("warm-restart-data");
    let (l, d) = (log.clone(), data.clone());
    let configure = move |c: &mut agui_serve::config::Config| {
        c.data_dir = d.clone();
        let mut agent = agent("warm", 0, &l, Some(&d));
        if let AgentKind::Acp(acp) = &mut agent.kind {
            acp.warm.preload_sessions = 2;
        }
        c.agents = vec![agent];
    };
    let server = TestServer::with(configure.clone()).await;
    let mut sessions = Vec::new();
    let mut histories: Vec<Vec<Value>> = Vec::new();
    for thread in ["old", "mid", "new"] {
        let mut history = Vec::new();
        let frames = run(
            &server,
            "warm",
            &next_turn(thread, 1, &mut history, "hello"),
        )
        .await;
        sessions.push(session_of(&frames));
        histories.push(history);
    }
    server.stop().await;

    let server = TestServer::with(configure).await;
    // The two most recent threads' sessions are loaded with no request.
    let loaded = wait_log(&log, "the loads at start-up", |l| count(l, "load") == 2).await;
    let loads: Vec<&str> = loaded
        .iter()
        .filter(|l| l.what() == "load")
        .map(Logged::session)
        .collect();
    assert!(loads.contains(&sessions[1].as_str()) && loads.contains(&sessions[2].as_str()));
    let frames = run(
        &server,
        "warm",
        &next_turn("new", 2, &mut histories[2], "again"),
    )
    .await;
    assert_eq!(session_of(&frames), sessions[2]);
    assert_eq!(text_of(&frames), "Echo: again");
    let thread: Value = get_json(&server, "/threads/new").await.1;
    assert_eq!(thread["metadata"]["session"]["how"], "loaded");
    let after = read_log(&log);
    assert_eq!(
        after[loaded.len()..]
            .iter()
            .map(Logged::what)
            .collect::<Vec<_>>(),
        ["prompt"],
        "the turn found its session loaded: {after:?}"
    );
    // The oldest was not loaded ahead: its turn loads it (at its admission).
    let frames = run(
        &server,
        "warm",
        &next_turn("old", 2, &mut histories[0], "again"),
    )
    .await;
    assert_eq!(session_of(&frames), sessions[0]);
    assert_eq!(text_of(&frames), "Echo: again");
    server.stop().await;
}

#[tokio::test]
async fn spares_are_kept_for_the_most_recently_seen_principals_only() {
    let scratch = temp_dir("warm-principals");
    let log = scratch.join("agent.log");
    let l = log.clone();
    let server = TestServer::with(move |c| {
        let mut agent = agent("warm", 1, &l, None);
        if let AgentKind::Acp(acp) = &mut agent.kind {
            acp.warm.spare_principals = 1;
        }
        c.agents = vec![agent];
    })
    .await;
    // The operator's spare, from the start.
    wait_spares(&server, "warm", 1).await;
    let operators = read_log(&log)
        .into_iter()
        .find(|l| l.what() == "new")
        .expect("new");

    // Alice's first turn: her spare is made, the operator's (seen less recently) goes.
    let minted = server
        .post("/tokens")
        .json(&json!({"sub": "alice"}))
        .sent()
        .await;
    assert_eq!(minted.status(), 200);
    let token: Value = minted.json().await.expect("json");
    let token = token["token"].as_str().expect("token").to_owned();
    let response = client()
        .post(server.url("/warm"))
        .bearer_auth(&token)
        .json(&run_body("a1", "a1-r1", "hello"))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    assert_ne!(
        session_of(&frames),
        operators.session(),
        "not the operator's"
    );
    let lines = wait_log(&log, "alice's spare, the operator's closed", |l| {
        count(l, "new") == 3
            && l.iter()
                .any(|l| l.what() == "close" && l.session() == operators.session())
    })
    .await;
    wait_spares(&server, "warm", 1).await;
    assert_eq!(
        count(&lines, "new"),
        3,
        "the operator's, alice's first session, alice's spare: {lines:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_session_the_agent_will_not_load_is_asked_for_once_after_a_restart() {
    let scratch = temp_dir("warm-unloadable");
    let (log, state) = (scratch.join("agent.log"), scratch.join("state"));
    std::fs::create_dir_all(&state).expect("state dir");
    let data = temp_dir("warm-unloadable-data");
    let (l, s, d) = (log.clone(), state.clone(), data.clone());
    let configure = move |c: &mut agui_serve::config::Config| {
        c.data_dir = d.clone();
        let mut agent = agent("warm", 0, &l, None);
        if let AgentKind::Acp(acp) = &mut agent.kind {
            acp.env
                .insert("SCRIPTED_AGENT_STATE".to_owned(), s.display().to_string());
            acp.sandbox.write.push(s.clone());
        }
        c.agents = vec![agent];
    };
    let server = TestServer::with(configure.clone()).await;
    let mut history = Vec::new();
    let frames = run(&server, "warm", &next_turn("u", 1, &mut history, "hello")).await;
    let session = session_of(&frames);
    server.stop().await;
    // The agent forgets the session.
    std::fs::remove_file(state.join(format!("{session}.jsonl"))).expect("its history");

    let server = TestServer::with(configure).await;
    let frames = run(&server, "warm", &next_turn("u", 2, &mut history, "again")).await;
    assert_eq!(text_of(&frames), "Echo: again");
    assert_ne!(session_of(&frames), session, "a new session");
    let thread: Value = get_json(&server, "/threads/u").await.1;
    assert_eq!(
        thread["metadata"]["session"]["how"],
        "new (earlier session could not be restored)"
    );
    let lines = read_log(&log);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.what() == "load" && l.session() == session)
            .count(),
        1,
        "the load the run's admission started, and no second one: {lines:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_mode_set_by_the_configuration_and_again_by_the_client_is_sent_once() {
    let scratch = temp_dir("mode-once");
    let log = scratch.join("agent.log");
    let l = log.clone();
    let server = TestServer::with(move |c| {
        let mut agent = agent("moded", 0, &l, None);
        if let AgentKind::Acp(acp) = &mut agent.kind {
            acp.session_defaults = json!({"mode": "plan"});
        }
        c.agents = vec![agent];
    })
    .await;
    let mut body = run_body("m", "r1", "settings");
    body["forwardedProps"] = json!({"acp": {"mode": "plan"}});
    let frames = run(&server, "moded", &body).await;
    assert!(
        text_of(&frames).starts_with("Mode: plan;"),
        "{}",
        text_of(&frames)
    );
    let sets = count(&read_log(&log), "set_mode");
    assert_eq!(sets, 1, "{:?}", read_log(&log));
    server.stop().await;
}
