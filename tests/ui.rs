//! Generative UI, allow-listed: components from the catalog reach the stream as
//! `ACTIVITY_SNAPSHOT` and stay in the transcript; anything else is refused to the agent
//! with nothing on the stream.

mod support;

use agui_serve::config::UiConfig;
use agui_serve::runtime::ui::default_examples;
use serde_json::{Value, json};
use support::*;

async fn show(server: &TestServer, thread: &str, component: &str, props: &str) -> Vec<SseFrame> {
    let r = post_run(
        server,
        "demo",
        &run_body(
            thread,
            &format!("{thread}-r"),
            &format!("/ui {component} {props}"),
        ),
    )
    .await;
    assert_eq!(r.status(), 200);
    let frames = SseReader::new(r).collect().await;
    assert_valid_segment(&frames);
    frames
}

fn activities(frames: &[SseFrame]) -> Vec<&SseFrame> {
    frames
        .iter()
        .filter(|f| f.kind() == "ACTIVITY_SNAPSHOT")
        .collect()
}

#[tokio::test]
async fn every_default_component_is_shown_and_kept_in_the_transcript() {
    let server = TestServer::start().await;
    for (i, (component, props)) in default_examples().into_iter().enumerate() {
        let thread = format!("ui-{i}");
        let frames = show(&server, &thread, component, &props.to_string()).await;
        let shown = activities(&frames);
        assert_eq!(shown.len(), 1, "{component}: {:?}", kinds(&frames));
        assert_eq!(shown[0].data["activityType"], component);
        assert_eq!(shown[0].data["content"], props);
        assert_eq!(text_of(&frames), format!("Showed {component}"));
        // A reload finds it: the transcript holds the activity message.
        let (status, body) = get_json(&server, &format!("/threads/{thread}/messages")).await;
        assert_eq!(status, 200);
        let activity = body["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .find(|m| m["role"] == "activity")
            .unwrap_or_else(|| panic!("{component}: {body}"))
            .clone();
        assert_eq!(activity["activityType"], component);
        assert_eq!(activity["content"], props);
        assert_eq!(activity["id"], shown[0].data["messageId"]);
    }
    // And the hydration run hands it to a reloaded page.
    let hydrated = server
        .get("/threads/ui-0/stream")
        .header("accept", "text/event-stream")
        .sent()
        .await;
    let frames = SseReader::new(hydrated).collect().await;
    let snapshot = frames
        .iter()
        .find(|f| f.kind() == "MESSAGES_SNAPSHOT")
        .expect("messages snapshot");
    assert!(
        snapshot.data["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .any(|m| m["role"] == "activity" && m["activityType"] == "approval_card")
    );
    server.stop().await;
}

#[tokio::test]
async fn off_list_oversized_and_invalid_props_are_refused_with_nothing_on_the_stream() {
    let server = TestServer::start().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "script_runner",
            json!({"code": "alert(1)"}),
            "unknown component \"script_runner\"",
        ),
        (
            "progress",
            json!({"label": "x", "percent": 1, "detail": "y".repeat(9000)}),
            "at most 8192 are allowed",
        ),
        (
            "progress",
            json!({"label": "x", "percent": 140}),
            "do not match its schema",
        ),
        (
            "progress",
            json!({"label": "x", "percent": 1, "html": "<img src=x onerror=alert(1)>"}),
            "do not match its schema",
        ),
    ];
    for (i, (component, props, reason)) in cases.into_iter().enumerate() {
        let frames = show(&server, &format!("bad-{i}"), component, &props.to_string()).await;
        assert!(activities(&frames).is_empty(), "{component} was shown");
        let said = text_of(&frames);
        assert!(
            said.starts_with("UI refused: ") && said.contains(reason),
            "{said:?} should say {reason:?}"
        );
        let (_, body) = get_json(&server, &format!("/threads/bad-{i}/messages")).await;
        assert!(
            !body.to_string().contains("\"activity\""),
            "nothing kept: {body}"
        );
    }
    let frames = show(&server, "not-json", "progress", "{not json").await;
    assert!(activities(&frames).is_empty());
    assert!(text_of(&frames).starts_with("UI refused: the props are not JSON"));
    server.stop().await;
}

#[tokio::test]
async fn the_catalog_is_the_configurations() {
    let server = TestServer::with(|c| {
        c.ui = UiConfig {
            components: vec![(
                "banner".to_owned(),
                json!({"type": "object", "properties": {"text": {"type": "string"}},
                    "required": ["text"], "additionalProperties": false}),
            )],
            max_props: 1024,
        };
    })
    .await;
    let frames = show(&server, "c1", "banner", r#"{"text":"hello"}"#).await;
    assert_eq!(activities(&frames).len(), 1);
    let frames = show(&server, "c2", "progress", r#"{"label":"x","percent":1}"#).await;
    assert!(
        activities(&frames).is_empty(),
        "a default not in this catalog"
    );
    assert!(text_of(&frames).contains("allowed: banner"));
    server.stop().await;
}
