//! Checkpoints of a thread's workspace: one before each turn of an ACP agent, in the
//! daemon's own store under its data directory, listed per message with the files the turn
//! changed, scoped like the thread, and removed with it.

mod support;

use agui_serve::confine::Confinement;
use serde_json::Value;
use support::probe::*;
use support::*;

async fn get(s: &Setup, path: &str, token: &str) -> reqwest::Response {
    client()
        .get(s.server.url(path))
        .bearer_auth(token)
        .sent()
        .await
}

#[tokio::test]
async fn each_turn_is_checkpointed_listed_by_its_message_and_removed_with_the_thread() {
    let s = setup("checkpoints", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, None)];
    })
    .await;
    let alice = token_for(&s.server, "alice").await;
    say(&s.server, &alice, "probe", "c", "write notes.md one").await;
    say(&s.server, &alice, "probe", "c", "write notes.md two").await;
    say(&s.server, &alice, "probe", "c", "pwd").await;

    let transcript: Value = get(&s, "/threads/c/messages", &alice)
        .await
        .json()
        .await
        .expect("json");
    let asked: Vec<Value> = transcript["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["id"].clone())
        .collect();
    let listed = get(&s, "/threads/c/checkpoints", &alice).await;
    assert_eq!(listed.status(), 200);
    let listed: Value = listed.json().await.expect("json");
    let checkpoints = listed["checkpoints"].as_array().expect("checkpoints");
    let before: Vec<Value> = checkpoints.iter().map(|c| c["messageId"].clone()).collect();
    assert_eq!(
        before, asked,
        "one checkpoint before each turn, by its message"
    );
    let files: Vec<Value> = checkpoints.iter().map(|c| c["files"].clone()).collect();
    assert_eq!(
        files,
        [
            serde_json::json!([{"path": "notes.md", "status": "added", "added": 1, "removed": 0}]),
            serde_json::json!([{"path": "notes.md", "status": "modified", "added": 1, "removed": 1}]),
            serde_json::json!([]),
        ]
    );
    assert!(
        checkpoints
            .iter()
            .all(|c| c["at"].as_str().is_some_and(|t| t.ends_with('Z')))
    );

    // Another principal's thread of the same id is not hers: nothing of Alice's shows.
    let bob = token_for(&s.server, "bob").await;
    assert_eq!(get(&s, "/threads/c/checkpoints", &bob).await.status(), 404);

    // The store is the daemon's, under its data directory; it goes with the thread.
    let store = s.data.join("checkpoints").join("probe");
    let repos = || std::fs::read_dir(&store).map_or(0, |dir| dir.count());
    assert_eq!(repos(), 1);
    let deleted = client()
        .delete(s.server.url("/threads/c"))
        .bearer_auth(&alice)
        .sent()
        .await;
    assert_eq!(deleted.status(), 204);
    eventually("the thread's checkpoints are removed", || repos() == 0).await;
}
