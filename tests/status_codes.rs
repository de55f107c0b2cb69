//! Every row of the status-code table in the interface contract, over a real socket.

mod support;

use std::time::Duration;

use agui_serve::config::{AgentConfig, Auth};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn error_body(
    response: reqwest::Response,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let status = response.status();
    let headers = response.headers().clone();
    assert_eq!(
        headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/json"),
        "error bodies are JSON"
    );
    let body: Value = response.json().await.expect("json body");
    assert!(
        body["code"].is_string() && body["message"].is_string(),
        "{body}"
    );
    (status, headers, body)
}

#[tokio::test]
async fn invalid_input_is_400_naming_the_field() {
    let server = TestServer::start().await;
    let response = server
        .post("/demo")
        .json(&json!({"threadId": "t", "messages": []}))
        .sent()
        .await;
    let (status, _, body) = error_body(response).await;
    assert_eq!(status, 400);
    assert_eq!(body["code"], "INVALID_INPUT");
    assert_eq!(body["field"], "runId");

    let response = server
        .post("/demo")
        .json(&json!({"threadId": "t", "runId": "r", "messages": [{"id": "1", "role": "user"}]}))
        .sent()
        .await;
    let (status, _, body) = error_body(response).await;
    assert_eq!(status, 400);
    assert_eq!(body["field"], "messages[0].content");

    let response = server
        .post("/demo")
        .header("content-type", "application/json")
        .body("{not json")
        .sent()
        .await;
    let (status, _, body) = error_body(response).await;
    assert_eq!(status, 400);
    assert_eq!(body["code"], "INVALID_INPUT");

    // The messages read like the contract: the whole path, plain words.
    for (raw, field, says) in [
        (
            r#"{"threadId":"t","runId":"r","messages":[{"id":"1","role":"user","content":5}]}"#,
            Some("messages[0].content"),
            "expected a string or an array of content parts, found a number",
        ),
        (
            r#"{"threadId":"t","runId":"r","messages":["#,
            None,
            "the request body ends before its JSON is complete",
        ),
        ("not json", None, "the request body is not valid JSON"),
    ] {
        let response = server
            .post("/demo")
            .header("content-type", "application/json")
            .body(raw)
            .sent()
            .await;
        let (status, _, body) = error_body(response).await;
        assert_eq!(status, 400);
        assert_eq!(body["field"].as_str(), field, "{body}");
        let message = body["message"].as_str().expect("message");
        assert!(message.contains(says), "{message}");
        assert!(
            !message.contains("untagged") && !message.contains("EOF") && !message.contains("`?`"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn missing_or_wrong_token_is_401_with_challenge() {
    let server = TestServer::start().await;
    for auth in [None, Some("Bearer wrong"), Some("Basic dGVzdA==")] {
        let mut request = client()
            .post(server.url("/demo"))
            .json(&run_body("t", "r", "hi"));
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let (status, headers, body) = error_body(request.sent().await).await;
        assert_eq!(status, 401, "{auth:?}");
        assert_eq!(body["code"], "UNAUTHORIZED");
        assert_eq!(headers["www-authenticate"], "Bearer");
    }
    // The query fallback works, for EventSource.
    let response = client()
        .get(server.url(&format!("/info?token={TOKEN}")))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn foreign_origin_is_403_and_allowed_origin_gets_cors() {
    let server = TestServer::with(|c| c.allowed_origins = vec!["https://app.example".into()]).await;
    let response = server
        .get("/info")
        .header("origin", "https://evil.example")
        .sent()
        .await;
    // Readable by the refused page (so its developer sees why, not "Failed to fetch").
    assert_eq!(
        response.headers()["access-control-allow-origin"],
        "https://evil.example"
    );
    let (status, _, body) = error_body(response).await;
    assert_eq!(status, 403);
    assert_eq!(body["code"], "FORBIDDEN_ORIGIN");
    // It says what would allow it.
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains("--allowed-origin https://evil.example"),
        "{message}"
    );

    let response = server
        .get("/info")
        .header("origin", "https://APP.example")
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["access-control-allow-origin"],
        "https://APP.example"
    );

    // Preflight: answered for allowed origins without a token, refused for others.
    let response = client()
        .request(reqwest::Method::OPTIONS, server.url("/demo"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type",
        )
        .sent()
        .await;
    assert_eq!(response.status(), 204);
    let allow_headers = response.headers()["access-control-allow-headers"]
        .to_str()
        .expect("ascii")
        .to_ascii_lowercase();
    for h in ["authorization", "content-type", "accept", "last-event-id"] {
        assert!(allow_headers.contains(h), "{allow_headers}");
    }
    // A refused origin's preflight passes, so its request reaches the readable refusal
    // (which comes before anything is done).
    let response = client()
        .request(reqwest::Method::OPTIONS, server.url("/demo"))
        .header("origin", "https://evil.example")
        .sent()
        .await;
    assert_eq!(response.status(), 204);
    assert_eq!(
        response.headers()["access-control-allow-origin"],
        "https://evil.example"
    );
    let response = client()
        .post(server.url("/demo"))
        .bearer_auth(TOKEN)
        .header("origin", "https://evil.example")
        .json(&run_body("evil", "r1", "hi"))
        .sent()
        .await;
    assert_eq!(response.status(), 403);
    let (status, _) = get_json(&server, "/threads/evil").await;
    assert_eq!(status, 404, "nothing was done for the refused origin");
    // Nothing else is readable by it: an unauthenticated route's answer has no CORS.
    let response = client()
        .get(server.url("/healthz"))
        .header("origin", "https://evil.example")
        .sent()
        .await;
    assert!(
        response
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );

    // No Origin header at all: no origin check (server-to-server).
    let response = server.get("/info").sent().await;
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn unknown_route_and_agent_are_404() {
    let server = TestServer::start().await;
    let response = client()
        .get(format!("http://{}/elsewhere", server.addr))
        .bearer_auth(TOKEN)
        .sent()
        .await;
    let (status, _, body) = error_body(response).await;
    assert_eq!(status, 404);
    assert_eq!(body["code"], "NOT_FOUND");

    let response = post_run(&server, "nobody", &run_body("t", "r", "hi")).await;
    let (status, _, body) = error_body(response).await;
    assert_eq!(status, 404);
    assert_eq!(body["code"], "UNKNOWN_AGENT");

    let response = server.post("/runs/no-such-run/cancel").sent().await;
    let (status, _, body) = error_body(response).await;
    assert_eq!(status, 404);
    assert_eq!(body["code"], "NOT_FOUND");
}

#[tokio::test]
async fn wrong_method_is_405_with_allow() {
    let server = TestServer::start().await;
    let response = server.get("/demo").sent().await;
    let (status, headers, body) = error_body(response).await;
    assert_eq!(status, 405);
    assert_eq!(body["code"], "METHOD_NOT_ALLOWED");
    assert!(headers["allow"].to_str().expect("ascii").contains("POST"));

    let response = server.post("/info").sent().await;
    let (status, headers, _) = error_body(response).await;
    assert_eq!(status, 405);
    assert!(headers["allow"].to_str().expect("ascii").contains("GET"));
}

#[tokio::test]
async fn unacceptable_accept_is_406() {
    let server = TestServer::start().await;
    for accept in ["*/*;q=0", "application/xml"] {
        let response = server
            .post("/demo")
            .header("accept", accept)
            .json(&run_body("t", "r", "hi"))
            .sent()
            .await;
        let (status, _, body) = error_body(response).await;
        assert_eq!(status, 406, "{accept}");
        assert_eq!(body["code"], "NOT_ACCEPTABLE");
    }
}

#[tokio::test]
async fn new_input_while_running_is_409() {
    let server = TestServer::start().await;
    let first = post_run(&server, "demo", &run_body("busy", "r1", "/slow 50 20")).await;
    assert_eq!(first.status(), 200);
    let mut reader = SseReader::new(first);
    assert_eq!(reader.next().await.expect("frame").kind(), "RUN_STARTED");

    let response = post_run(&server, "demo", &run_body("busy", "r2", "again")).await;
    let (status, _, body) = error_body(response).await;
    assert_eq!(status, 409);
    assert_eq!(body["code"], "RUN_IN_PROGRESS");
    // The live run's id, to attach to or cancel.
    assert_eq!(body["runId"], "r1");
    // The first run is unaffected.
    let rest = reader.collect().await;
    assert_eq!(
        rest.last().map(|f| f.kind().to_owned()).as_deref(),
        Some("RUN_FINISHED")
    );
}

/// `run_body` with `forwardedProps.agui.multitask` set to `strategy`.
fn with_multitask(thread: &str, run: &str, text: &str, strategy: &str) -> serde_json::Value {
    let mut body = run_body(thread, run, text);
    body["forwardedProps"] = serde_json::json!({"agui": {"multitask": strategy}});
    body
}

/// The last frame of a stream, its type and its outcome's type.
fn ending(frames: &[SseFrame]) -> (String, Option<String>) {
    let last = frames.last().expect("a frame");
    (
        last.kind().to_owned(),
        last.data["outcome"]["type"].as_str().map(str::to_owned),
    )
}

#[tokio::test]
async fn new_input_with_multitask_interrupt_cancels_the_live_run_and_runs() {
    let server = TestServer::start().await;
    let first = post_run(&server, "demo", &run_body("busy", "r1", "/slow 200 20")).await;
    let mut reader = SseReader::new(first);
    assert_eq!(reader.next().await.expect("frame").kind(), "RUN_STARTED");

    let second = post_run(
        &server,
        "demo",
        &with_multitask("busy", "r2", "again", "interrupt"),
    )
    .await;
    assert_eq!(second.status(), 200);
    let frames = SseReader::new(second).collect().await;
    assert_valid_segment(&frames);
    assert_eq!(text_of(&frames), "You said: again");
    // The interrupted run ended cancelled, on every stream that followed it.
    let rest = reader.collect().await;
    assert_eq!(
        ending(&rest),
        ("RUN_FINISHED".to_owned(), Some("cancelled".to_owned()))
    );
    let (_, thread) = get_json(&server, "/threads/busy").await;
    assert_eq!(thread["lastRun"]["runId"], "r2");
}

#[tokio::test]
async fn an_agent_s_multitask_default_and_a_request_s_own() {
    let server = TestServer::with(|c| {
        c.agents = vec![AgentConfig {
            multitask: agui_serve::agent::Multitask::Interrupt,
            history: Default::default(),
            ..AgentConfig::demo()
        }];
    })
    .await;
    let first = post_run(&server, "demo", &run_body("t", "r1", "/slow 200 20")).await;
    let mut reader = SseReader::new(first);
    assert_eq!(reader.next().await.expect("frame").kind(), "RUN_STARTED");
    // The request's own strategy wins over the agent's.
    let refused = post_run(&server, "demo", &with_multitask("t", "r2", "no", "reject")).await;
    let (status, _, body) = error_body(refused).await;
    assert_eq!(
        (status, body["runId"].clone()),
        (StatusCode::CONFLICT, serde_json::json!("r1"))
    );
    // Without one, the agent's: the live run is interrupted.
    let second = post_run(&server, "demo", &run_body("t", "r3", "again")).await;
    assert_eq!(second.status(), 200);
    assert_eq!(
        text_of(&SseReader::new(second).collect().await),
        "You said: again"
    );
    assert_eq!(
        ending(&reader.collect().await).1.as_deref(),
        Some("cancelled")
    );

    // A request that brings only a `resume[]` (nothing waits for it) never interrupts.
    let live = post_run(&server, "demo", &run_body("t", "r5", "/slow 100 20")).await;
    let mut live = SseReader::new(live);
    assert_eq!(live.next().await.expect("frame").kind(), "RUN_STARTED");
    let mut resume_only = run_body("t", "r6", "/slow 100 20");
    resume_only["messages"][0]["id"] = serde_json::json!("r5-u");
    resume_only["resume"] = serde_json::json!([{"interruptId": "i1", "status": "resolved"}]);
    let (status, _, _) = error_body(post_run(&server, "demo", &resume_only).await).await;
    assert_eq!(status, StatusCode::CONFLICT);
    // The live run ends as it would have: finished, not cancelled.
    assert_eq!(
        ending(&live.collect().await),
        ("RUN_FINISHED".to_owned(), None)
    );

    // An unknown strategy, or no string, is refused by name.
    for strategy in [
        serde_json::json!("Enqueue"),
        serde_json::json!("later"),
        serde_json::json!(1),
    ] {
        let mut body = run_body("t", "r4", "x");
        body["forwardedProps"] = serde_json::json!({"agui": {"multitask": strategy}});
        let (status, _, error) = error_body(post_run(&server, "demo", &body).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{strategy}");
        assert_eq!(error["field"], "forwardedProps.agui.multitask");
    }
}

#[tokio::test]
async fn oversized_body_is_413_without_reading_it() {
    let server = TestServer::start().await;
    // Declared length over the limit: refused from the headers alone.
    let mut stream = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /agui/demo HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        9 * 1024 * 1024
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .expect("answered before the body was sent")
        .expect("read");
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("PAYLOAD_TOO_LARGE"), "{text}");

    // Chunked with no declared length: cut off at the limit.
    let big = vec![b' '; 8 * 1024 * 1024 + 10];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(
        big.chunks(64 * 1024)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>(),
    ));
    let response = server
        .post("/demo")
        .header("content-type", "application/json")
        .body(body)
        .sent()
        .await;
    let (status, _, body) = error_body(response).await;
    assert_eq!(status, 413);
    assert_eq!(body["code"], "PAYLOAD_TOO_LARGE");
}

#[tokio::test]
async fn non_json_content_type_is_415() {
    let server = TestServer::start().await;
    for content_type in [Some("text/plain"), None] {
        let mut request = server
            .post("/demo")
            .body(run_body("t", "r", "hi").to_string());
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        let (status, _, body) = error_body(request.sent().await).await;
        assert_eq!(status, 415, "{content_type:?}");
        assert_eq!(body["code"], "UNSUPPORTED_MEDIA_TYPE");
    }
}

#[tokio::test]
async fn over_capacity_is_503_with_retry_after() {
    let server = TestServer::with(|c| c.max_concurrent_runs = 1).await;
    let first = post_run(&server, "demo", &run_body("a", "r1", "/slow 30 20")).await;
    assert_eq!(first.status(), 200);
    let response = post_run(&server, "demo", &run_body("b", "r2", "hi")).await;
    let (status, headers, body) = error_body(response).await;
    assert_eq!(status, 503);
    assert_eq!(body["code"], "OVER_CAPACITY");
    assert!(headers.contains_key("retry-after"));
    // The slot frees when the run ends.
    SseReader::new(first).collect().await;
    support::eventually("slot released", || true).await;
    let mut ok = false;
    for _ in 0..50 {
        let response = post_run(&server, "demo", &run_body("b", "r3", "hi")).await;
        if response.status() == 200 {
            ok = true;
            SseReader::new(response).collect().await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "slot was not released");
}

#[tokio::test]
async fn draining_is_503_with_retry_after() {
    let server = TestServer::with(|c| c.shutdown_grace = Duration::from_secs(5)).await;
    let http = client();
    // Open a keep-alive connection first; the accept loop stops at shutdown, existing
    // connections go on being served until the runs are done.
    let slow = http
        .post(server.url("/demo"))
        .bearer_auth(TOKEN)
        .json(&run_body("d", "r1", "/slow 40 25"))
        .sent()
        .await;
    assert_eq!(slow.status(), 200);
    let warm = http.get(server.url("/healthz")).sent().await;
    assert_eq!(warm.status(), 200);
    warm.bytes().await.expect("body");
    server.shutdown.cancel();
    let mut saw_draining = false;
    for _ in 0..50 {
        let response = http
            .post(server.url("/demo"))
            .bearer_auth(TOKEN)
            .json(&run_body("d2", "r2", "hi"))
            .send()
            .await;
        match response {
            Ok(response) if response.status() == 503 => {
                let (_, headers, body) = error_body(response).await;
                assert_eq!(body["code"], "DRAINING");
                assert!(headers.contains_key("retry-after"));
                saw_draining = true;
                break;
            }
            Ok(response) => {
                response.bytes().await.ok();
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(saw_draining, "no DRAINING answer during shutdown");
    let frames = SseReader::new(slow).collect().await;
    assert_eq!(
        frames.last().map(|f| f.kind().to_owned()).as_deref(),
        Some("RUN_FINISHED")
    );
}

#[tokio::test]
async fn missing_token_configuration_fails_closed_with_500() {
    let server = TestServer::with(|c| c.auth = Auth::Misconfigured).await;
    let response = client()
        .post(server.url("/demo"))
        .bearer_auth("anything")
        .json(&run_body("t", "r", "hi"))
        .sent()
        .await;
    let (status, _, body) = error_body(response).await;
    assert_eq!(status, 500);
    assert_eq!(body["code"], "AUTH_MISCONFIGURED");
    // Unauthenticated routes still answer.
    let response = client().get(server.url("/healthz")).sent().await;
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn info_is_the_copilotkit_runtime_shape_plus_our_fields() {
    let server = TestServer::start().await;
    let (status, info) = get_json(&server, "/info").await;
    assert_eq!(status, 200);
    // CopilotKit reads `agents` with Object.entries: an object keyed by agent name.
    let demo = &info["agents"]["demo"];
    assert_eq!(demo["name"], "demo");
    assert_eq!(demo["className"], "HttpAgent");
    assert!(demo["description"].is_string());
    assert_eq!(
        demo["url"],
        format!("http://{}/agui/demo", server.addr),
        "{info}"
    );
    assert_eq!(info["mode"], "sse");
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(info["threadEndpoints"]["list"], true);
    assert_eq!(info["threadEndpoints"]["mutations"], true);
    for key in ["inspect", "realtimeMetadata"] {
        assert_eq!(info["threadEndpoints"][key], false, "{key}");
    }
    // No license is checked here: CopilotKit's threads UI asks the threads endpoint.
    assert_eq!(info["licenseStatus"], "unknown");
    for key in [
        "suggestions",
        "audioFileTranscriptionEnabled",
        "a2uiEnabled",
        "openGenerativeUIEnabled",
    ] {
        assert_eq!(info[key], false, "{key}");
    }
    assert_eq!(info["telemetryDisabled"], true);
    assert_eq!(info["protocol"], "ag-ui");
    assert_eq!(info["protocolVersion"], "1.0");
    assert_eq!(info["path"], "/agui");
    assert_eq!(info["capabilities"]["reattach"], true);
    // Each agent's capabilities, in the AG-UI SDK's shape (the conformance suite parses
    // them with its schema).
    let caps = &demo["capabilities"];
    assert_eq!(caps["identity"]["type"], "agui-serve/demo");
    assert_eq!(caps["transport"]["streaming"], true);
    assert_eq!(caps["transport"]["resumable"], true);
    // Protobuf is served on the run and reattach routes.
    assert_eq!(caps["transport"]["httpBinary"], true);
    // How to resume: the stream route, and the client package that uses it.
    assert_eq!(
        caps["custom"]["resume"]["stream"],
        "/agui/threads/{threadId}/stream"
    );
    let package: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/resume/package.json"),
        )
        .expect("clients/resume/package.json"),
    )
    .expect("package.json is JSON");
    assert_eq!(caps["custom"]["resume"]["client"], package["name"]);
    assert_eq!(caps["humanInTheLoop"]["approvals"], true);
    assert_eq!(caps["humanInTheLoop"]["interrupts"], false);
    assert_eq!(caps["multimodal"]["input"]["image"], false);
    assert_eq!(caps["reasoning"]["supported"], true);
}
