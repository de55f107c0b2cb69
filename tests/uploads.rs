//! Uploads (`POST {path}/uploads`): stored per principal, capped and type-checked, named
//! by URL in a message's content part, read into the agent's prompt as the part's data (an
//! image block for an ACP agent that takes images) while the transcript keeps the URL,
//! and removed with the thread that used them.

mod support;

use std::time::Duration;

use agui_serve::config::{
    AcpConfig, AgentConfig, AgentKind, Config, FrontendMcp, Hitl, Permissions,
};
use serde_json::{Value, json};
use support::*;

/// A PNG's signature and the start of its header: enough for the type check.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0";

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The scripted ACP agent, taking images.
fn scripted(state: &std::path::Path) -> AgentConfig {
    let mut env = std::collections::BTreeMap::new();
    env.insert("SCRIPTED_AGENT_IMAGES".to_owned(), "1".to_owned());
    AgentConfig {
        name: "scripted".to_owned(),
        description: "scripted ACP agent".to_owned(),
        hitl: Hitl::Tool,
        multitask: Default::default(),
        history: Default::default(),
        budget: None,
        kind: AgentKind::Acp(AcpConfig {
            command: vec![scripted_agent().to_str().expect("utf8").to_owned()],
            env,
            pool_size: 1,
            idle_ttl: Duration::from_secs(600),
            permissions: Permissions::Ask,
            frontend_mcp: FrontendMcp::Never,
            sandbox: agui_serve::confine::Sandbox {
                write: vec![state.to_owned()],
                ..Default::default()
            },
            ..AcpConfig::new(Vec::new())
        }),
    }
}

async fn server(tag: &str, adjust: impl FnOnce(&mut Config) + Send + 'static) -> TestServer {
    let state = temp_dir(tag);
    TestServer::with(move |c: &mut Config| {
        c.agents = vec![scripted(&state), AgentConfig::demo()];
        adjust(c);
    })
    .await
}

/// Mints a scoped token for `sub` with the master token.
async fn token(server: &TestServer, sub: &str) -> String {
    let response = server
        .post("/tokens")
        .json(&json!({"sub": sub, "ttlSeconds": 600}))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.expect("json");
    answer["token"].as_str().expect("token").to_owned()
}

async fn upload(
    server: &TestServer,
    token: &str,
    content_type: &str,
    bytes: &[u8],
) -> reqwest::Response {
    client()
        .post(server.url("/uploads?filename=dot.png"))
        .bearer_auth(token)
        .header("content-type", content_type)
        .body(bytes.to_vec())
        .sent()
        .await
}

async fn created(response: reqwest::Response) -> Value {
    assert_eq!(response.status(), 201);
    let location = response.headers()["location"]
        .to_str()
        .expect("location")
        .to_owned();
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        location,
        format!("/agui/uploads/{}", body["id"].as_str().expect("id"))
    );
    body
}

fn image_message(id: &str, url: &str) -> Value {
    json!({"id": id, "role": "user", "content": [
        {"type": "text", "text": "blocks"},
        {"type": "image", "source": {"type": "url", "value": url, "mimeType": "image/png"}},
    ]})
}

fn run_with(thread: &str, run: &str, messages: Value) -> Value {
    json!({"threadId": thread, "runId": run, "messages": messages, "tools": [],
        "context": [], "state": {}, "forwardedProps": {}})
}

#[tokio::test]
async fn an_uploaded_image_reaches_an_acp_agent_as_an_image_block_and_goes_with_its_thread() {
    let server = server("uploads-acp", |_| {}).await;
    let ann = token(&server, "ann").await;
    let body = created(upload(&server, &ann, "image/png", PNG).await).await;
    assert_eq!(body["size"], PNG.len());
    assert_eq!(body["contentType"], "image/png");
    let url = body["url"].as_str().expect("url").to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.contains("/agui/uploads/"),
        "{url}"
    );
    let path = url.split_once("/agui").expect("path").1.to_owned();

    // The owner reads it back as it was sent.
    let got = client()
        .get(server.url(&path))
        .bearer_auth(&ann)
        .sent()
        .await;
    assert_eq!(got.status(), 200);
    assert_eq!(got.headers()["content-type"], "image/png");
    assert_eq!(got.headers()["x-content-type-options"], "nosniff");
    assert_eq!(&got.bytes().await.expect("bytes")[..], PNG);

    // A run names it by URL: the agent gets an image block with the file's bytes.
    let response = client()
        .post(server.url("/scripted"))
        .bearer_auth(&ann)
        .header("accept", "text/event-stream")
        .json(&run_with("pic", "r1", json!([image_message("u1", &url)])))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    assert_valid_segment(&frames);
    let text = text_of(&frames);
    let blocks: Value =
        serde_json::from_str(text.strip_prefix("Blocks: ").expect("blocks")).expect("json");
    assert_eq!(
        blocks,
        json!([{"type": "text", "text": "blocks"},
            {"type": "image", "data": base64(PNG), "mimeType": "image/png"}])
    );

    // A second turn in the same session: only its new message is prompted, with its own
    // upload's bytes.
    let gif = b"GIF89a\x01\0\x01\0";
    let second = created(upload(&server, &ann, "image/gif", gif).await).await;
    let second_url = second["url"].as_str().expect("url");
    let mut next = image_message("u2", second_url);
    next["content"][1]["source"]["mimeType"] = json!("image/gif");
    let response = client()
        .post(server.url("/scripted"))
        .bearer_auth(&ann)
        .header("accept", "text/event-stream")
        .json(&run_with(
            "pic",
            "r2",
            json!([image_message("u1", &url), next]),
        ))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    let text = text_of(&frames);
    let blocks: Value =
        serde_json::from_str(text.strip_prefix("Blocks: ").expect("blocks")).expect("json");
    assert_eq!(
        blocks,
        json!([{"type": "text", "text": "blocks"},
            {"type": "image", "data": base64(gif), "mimeType": "image/gif"}])
    );

    // The transcript keeps the URL, not the bytes (shown with a link's query).
    let messages: Value = client()
        .get(server.url("/threads/pic/messages"))
        .bearer_auth(&ann)
        .sent()
        .await
        .json()
        .await
        .expect("json");
    let kept = messages["messages"][0]["content"][1]["source"]["value"]
        .as_str()
        .expect("url");
    assert!(kept.starts_with(&format!("{url}?owner=")), "{kept}");

    // Deleting the thread removes the upload.
    let deleted = client()
        .delete(server.url("/threads/pic"))
        .bearer_auth(&ann)
        .sent()
        .await;
    assert_eq!(deleted.status(), 204);
    let gone = client()
        .get(server.url(&path))
        .bearer_auth(&ann)
        .sent()
        .await;
    assert_eq!(gone.status(), 404);
}

#[tokio::test]
async fn uploads_are_their_principal_s_own() {
    let server = server("uploads-scoped", |_| {}).await;
    let (ann, bob) = (token(&server, "ann").await, token(&server, "bob").await);
    let body = created(upload(&server, &ann, "image/png", PNG).await).await;
    let url = body["url"].as_str().expect("url").to_owned();
    let path = format!("/uploads/{}", body["id"].as_str().expect("id"));

    // Someone else neither reads nor deletes it, and cannot send it to an agent: the
    // same answer as for an upload that does not exist.
    let read = client()
        .get(server.url(&path))
        .bearer_auth(&bob)
        .sent()
        .await;
    assert_eq!(read.status(), 404);
    let delete = client()
        .delete(server.url(&path))
        .bearer_auth(&bob)
        .sent()
        .await;
    assert_eq!(delete.status(), 404);
    let run = client()
        .post(server.url("/scripted"))
        .bearer_auth(&bob)
        .header("accept", "text/event-stream")
        .json(&run_with("b1", "r1", json!([image_message("u1", &url)])))
        .sent()
        .await;
    assert_eq!(run.status(), 400);
    let error: Value = run.json().await.expect("json");
    assert_eq!(error["field"], "messages[0].content[1]");
    assert!(
        error["message"]
            .as_str()
            .expect("message")
            .contains("does not exist"),
        "{error}"
    );
    // Nothing was made of the refused run.
    let thread = client()
        .get(server.url("/threads/b1"))
        .bearer_auth(&bob)
        .sent()
        .await;
    assert_eq!(thread.status(), 404);

    // The owner deletes it; then it is gone for the owner too.
    let delete = client()
        .delete(server.url(&path))
        .bearer_auth(&ann)
        .sent()
        .await;
    assert_eq!(delete.status(), 204);
    let read = client()
        .get(server.url(&path))
        .bearer_auth(&ann)
        .sent()
        .await;
    assert_eq!(read.status(), 404);
}

#[tokio::test]
async fn uploads_are_refused_with_a_reason_over_their_limits() {
    let server = server("uploads-limits", |c| {
        c.uploads.max_bytes = 64;
        c.uploads.quota = 100;
    })
    .await;
    let ann = token(&server, "ann").await;
    let error = |response: reqwest::Response, status: u16, code: &'static str| async move {
        assert_eq!(response.status().as_u16(), status);
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["code"], code, "{body}");
        body
    };
    // Too large, declared or not.
    error(
        upload(&server, &ann, "text/plain", &[b'a'; 65]).await,
        413,
        "PAYLOAD_TOO_LARGE",
    )
    .await;
    // A type not on the list; no type at all.
    let html = error(
        upload(&server, &ann, "text/html", b"<p>").await,
        415,
        "UNSUPPORTED_MEDIA_TYPE",
    )
    .await;
    assert!(
        html["message"]
            .as_str()
            .expect("message")
            .contains("text/html")
    );
    let none = client()
        .post(server.url("/uploads"))
        .bearer_auth(&ann)
        .body("x")
        .sent()
        .await;
    error(none, 415, "UNSUPPORTED_MEDIA_TYPE").await;
    // Bytes that are not what the type says.
    error(
        upload(&server, &ann, "image/png", b"GIF89a....").await,
        415,
        "CONTENT_MISMATCH",
    )
    .await;
    // The quota counts what the principal keeps.
    created(upload(&server, &ann, "text/plain", &[b'a'; 60]).await).await;
    error(
        upload(&server, &ann, "text/plain", &[b'b'; 50]).await,
        413,
        "UPLOAD_QUOTA",
    )
    .await;
    // Someone else's quota is their own.
    let bob = token(&server, "bob").await;
    created(upload(&server, &bob, "text/plain; charset=utf-8", &[b'c'; 50]).await).await;

    // /info says what is accepted.
    let (_, info) = get_json(&server, "/info").await;
    assert_eq!(info["uploads"]["maxSize"], 64);
    assert!(
        info["uploads"]["url"]
            .as_str()
            .expect("url")
            .ends_with("/agui/uploads")
    );
    assert!(
        info["uploads"]["types"]
            .as_array()
            .expect("types")
            .contains(&json!("image/png"))
    );
}

#[tokio::test]
async fn an_upload_of_the_wrong_kind_for_its_part_is_refused() {
    let server = server("uploads-kind", |_| {}).await;
    let ann = token(&server, "ann").await;
    let body = created(upload(&server, &ann, "text/plain", b"hello").await).await;
    let url = body["url"].as_str().expect("url");
    let response = client()
        .post(server.url("/scripted"))
        .bearer_auth(&ann)
        .header("accept", "text/event-stream")
        .json(&run_with("k", "r1", json!([image_message("u1", url)])))
        .sent()
        .await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.expect("json");
    assert!(
        error["message"]
            .as_str()
            .expect("message")
            .contains("is text/plain, not image"),
        "{error}"
    );

    // As a document it goes: a text resource with the file's text.
    let document = json!([{"id": "u1", "role": "user", "content": [
        {"type": "text", "text": "blocks"},
        {"type": "document", "source": {"type": "url", "value": url}},
    ]}]);
    let response = client()
        .post(server.url("/scripted"))
        .bearer_auth(&ann)
        .header("accept", "text/event-stream")
        .json(&run_with("k", "r2", document))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    let text = text_of(&frames);
    let blocks: Value =
        serde_json::from_str(text.strip_prefix("Blocks: ").expect("blocks")).expect("json");
    assert_eq!(blocks[1]["resource"]["text"], "hello", "{blocks}");
    assert_eq!(blocks[1]["resource"]["mimeType"], "text/plain");
}

#[tokio::test]
async fn an_upload_removed_later_does_not_block_its_thread_and_a_run_carries_at_most_twice_the_largest_file()
 {
    let server = server("uploads-later", |c| c.uploads.max_bytes = 1024).await;
    let ann = token(&server, "ann").await;
    let body = created(upload(&server, &ann, "image/png", PNG).await).await;
    let url = body["url"].as_str().expect("url").to_owned();
    let path = format!("/uploads/{}", body["id"].as_str().expect("id"));
    let post = |run: &'static str, messages: Value| {
        client()
            .post(server.url("/scripted"))
            .bearer_auth(&ann)
            .header("accept", "text/event-stream")
            .json(&run_with("later", run, messages))
            .sent()
    };
    let first = post("r1", json!([image_message("u1", &url)])).await;
    assert_eq!(first.status(), 200);
    SseReader::new(first).collect().await;

    // The owner removes the upload; the client still sends the whole transcript.
    let delete = client()
        .delete(server.url(&path))
        .bearer_auth(&ann)
        .sent()
        .await;
    assert_eq!(delete.status(), 204);
    let next = post(
        "r2",
        json!([image_message("u1", &url), {"id": "u2", "role": "user", "content": "recall"}]),
    )
    .await;
    assert_eq!(next.status(), 200);
    let frames = SseReader::new(next).collect().await;
    assert_eq!(text_of(&frames), "Heard: blocks | recall");

    // Parts naming uploads are counted each time they name one.
    let again =
        created(upload(&server, &ann, "image/png", &[PNG, &[0u8; 950]].concat()).await).await;
    let big = again["url"].as_str().expect("url");
    let mut many = image_message("u3", big);
    many["content"]
        .as_array_mut()
        .expect("parts")
        .extend([1, 2].map(|n| json!({"type": "image", "source": {"type": "url", "value": format!("{big}?copy={n}"), "mimeType": "image/png"}})));
    let refused = post("r3", json!([many])).await;
    assert_eq!(refused.status(), 400);
    let error: Value = refused.json().await.expect("json");
    assert!(
        error["message"]
            .as_str()
            .expect("message")
            .contains("more than 2048 bytes"),
        "{error}"
    );

    // An empty file is refused.
    let empty = upload(&server, &ann, "text/plain", b"").await;
    assert_eq!(empty.status(), 400);
}

/// Every file under `dir`, read whole (the store's database, its WAL, uploads' notes).
fn files_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                out.push((path, bytes));
            }
        }
    }
    out
}

#[tokio::test]
async fn a_page_shows_an_upload_by_a_short_lived_signed_link_and_no_token_is_stored() {
    let server = server("uploads-preview", |_| {}).await;
    let ann = token(&server, "ann").await;
    let body = created(upload(&server, &ann, "image/png", PNG).await).await;
    let id = body["id"].as_str().expect("id").to_owned();
    let preview = body["previewUrl"].as_str().expect("previewUrl").to_owned();
    assert!(
        preview.starts_with(body["url"].as_str().expect("url")),
        "{preview}"
    );
    assert!(body["previewExpiresAt"].is_string(), "{body}");
    assert!(
        !preview.contains(&ann) && !preview.contains(TOKEN),
        "{preview}"
    );

    // An <img> sends no header: the link alone shows the file, as the file.
    let shown = client().get(&preview).sent().await;
    assert_eq!(shown.status(), 200);
    assert_eq!(shown.headers()["content-type"], "image/png");
    assert_eq!(shown.headers()["x-content-type-options"], "nosniff");
    assert_eq!(&shown.bytes().await.expect("bytes")[..], PNG);

    // The link is for that file only, unaltered, and only to look at.
    let other = created(upload(&server, &ann, "image/png", PNG).await).await;
    let other_id = other["id"].as_str().expect("id");
    let query = preview.split_once('?').expect("query").1;
    for (what, url) in [
        (
            "another upload",
            server.url(&format!("/uploads/{other_id}?{query}")),
        ),
        ("a changed expiry", preview.replace("expires=", "expires=9")),
        ("a changed signature", {
            let at = preview.len() - 1;
            let last = if preview.ends_with('0') { "1" } else { "0" };
            format!("{}{last}", &preview[..at])
        }),
        ("no signature", server.url(&format!("/uploads/{id}"))),
    ] {
        let refused = client().get(&url).sent().await;
        assert!(
            refused.status() == 403 || refused.status() == 401,
            "{what}: {}",
            refused.status()
        );
        let error: Value = refused.json().await.expect("json");
        assert!(error["code"].is_string(), "{what}: {error}");
    }
    let removed = client().delete(&preview).sent().await;
    assert_eq!(removed.status(), 401, "a link does not delete");

    // A page sends the link back in its message, even with a token pasted into it: the
    // run finds the upload, and what is kept is the plain URL.
    let pasted = format!("{preview}&token={TOKEN}");
    let response = client()
        .post(server.url("/scripted"))
        .bearer_auth(&ann)
        .header("accept", "text/event-stream")
        .json(&run_with(
            "pic",
            "r1",
            json!([image_message("u1", &pasted)]),
        ))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    assert!(
        text_of(&frames).contains(&base64(PNG)),
        "{}",
        text_of(&frames)
    );

    // Whatever shows the thread again shows the image by a fresh link of its own.
    let messages: Value = client()
        .get(server.url("/threads/pic/messages"))
        .bearer_auth(&ann)
        .sent()
        .await
        .json()
        .await
        .expect("json");
    let shown_url = messages["messages"][0]["content"][1]["source"]["value"]
        .as_str()
        .expect("url")
        .to_owned();
    assert!(
        shown_url.contains(&format!("/uploads/{id}?")),
        "{shown_url}"
    );
    assert!(!shown_url.contains("token="), "{shown_url}");
    assert_eq!(client().get(&shown_url).sent().await.status(), 200);
    let reloaded = client()
        .get(server.url("/threads/pic/stream"))
        .bearer_auth(&ann)
        .header("accept", "text/event-stream")
        .sent()
        .await;
    let frames = SseReader::new(reloaded).collect().await;
    let snapshot = frames
        .iter()
        .find(|f| f.kind() == "MESSAGES_SNAPSHOT")
        .expect("a snapshot");
    let snapshot_url = snapshot.data["messages"][0]["content"][1]["source"]["value"]
        .as_str()
        .expect("url")
        .to_owned();
    assert!(snapshot_url.contains("signature="), "{snapshot_url}");
    assert_eq!(client().get(&snapshot_url).sent().await.status(), 200);

    // Nothing the daemon keeps holds a token or a link's signature.
    let data = server.data_dir.clone();
    server.stop().await;
    for (path, bytes) in files_under(&data) {
        for needle in [TOKEN, "signature="] {
            assert!(
                find(&bytes, needle.as_bytes()).is_none(),
                "{} holds {needle:?}",
                path.display()
            );
        }
    }
}
