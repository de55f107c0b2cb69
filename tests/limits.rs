//! The limits in docs/http-api.md's table, each enforced with a JSON error over a real socket:
//! connections per listener, header and body timeouts, header size, id length.

mod support;

use std::time::Duration;

use agui_serve::http::Limits;
use serde_json::Value;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `request` on a fresh connection and reads until the server closes it.
async fn raw_exchange(server: &TestServer, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    read_until_closed(&mut stream).await
}

async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got))
        .await
        .expect("the server closes the connection")
        .expect("read");
    String::from_utf8_lossy(&got).into_owned()
}

/// The status and JSON body of a raw HTTP/1.1 response (`content-length` framed).
fn json_answer(raw: &str) -> (u16, Value) {
    let (head, body) = raw.split_once("\r\n\r\n").expect("a response head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains("content-type: application/json"),
        "JSON error: {raw}"
    );
    let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {raw}"));
    assert!(
        body["code"].is_string() && body["message"].is_string(),
        "{body}"
    );
    (status, body)
}

#[tokio::test]
async fn connections_over_the_cap_get_a_json_503_and_are_closed() {
    let limits = Limits {
        max_connections: 4,
        ..Limits::default()
    };
    let server = TestServer::with_limits(|_| {}, limits).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(server.addr).await.expect("connect"));
    }
    let raw = raw_exchange(&server, b"GET /agui/healthz HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let (status, body) = json_answer(&raw);
    assert_eq!(status, 503, "{raw}");
    assert_eq!(body["code"], "OVER_CAPACITY");
    assert!(raw.to_ascii_lowercase().contains("retry-after: 1"), "{raw}");

    // A held connection is served normally, and once one closes a new one is too.
    held[0]
        .write_all(b"GET /agui/healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let raw = read_until_closed(&mut held[0]).await;
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    drop(held.remove(0));
    let mut again = None;
    for _ in 0..100 {
        let raw = raw_exchange(
            &server,
            b"GET /agui/healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        if raw.starts_with("HTTP/1.1 200") {
            again = Some(raw);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again.is_some(), "a freed slot is served again");
}

#[tokio::test]
async fn a_body_that_never_arrives_gets_a_json_408_and_the_connection_closes() {
    let limits = Limits {
        body_read_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = TestServer::with_limits(|_| {}, limits).await;
    let started = std::time::Instant::now();
    let raw = raw_exchange(
        &server,
        format!(
            "POST /agui/demo HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"threadId\":"
        )
        .as_bytes(),
    )
    .await;
    let (status, body) = json_answer(&raw);
    assert_eq!(status, 408, "{raw}");
    assert_eq!(body["code"], "REQUEST_TIMEOUT");
    assert!(started.elapsed() < Duration::from_secs(5));

    // Chunked, over HTTP/2 with TLS: the same answer on the stream.
    let dir = temp_dir("body-timeout");
    let tls = TestServer::with_limits(
        move |c| {
            c.tls = agui_serve::config::TlsMode::SelfSigned;
            c.data_dir = dir;
        },
        limits,
    )
    .await;
    let never = futures_util::stream::pending::<Result<Vec<u8>, std::io::Error>>();
    let first = futures_util::stream::iter([Ok(b"{\"threadId\":".to_vec())]);
    let body = reqwest::Body::wrap_stream(futures_util::StreamExt::chain(first, never));
    let response = tls
        .post("/demo")
        .header("content-type", "application/json")
        .body(body)
        .sent()
        .await;
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 408);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["code"], "REQUEST_TIMEOUT");
}

#[tokio::test]
async fn ids_with_control_characters_or_over_256_bytes_are_400_naming_the_field() {
    let server = TestServer::start().await;
    let long = "x".repeat(257);
    for (thread, run, field) in [
        ("t\r\nFORGED", "r", "threadId"),
        ("t", "r\u{1b}[2J", "runId"),
        (long.as_str(), "r", "threadId"),
    ] {
        let response = post_run(&server, "demo", &run_body(thread, run, "hi")).await;
        assert_eq!(response.status(), 400);
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["code"], "INVALID_INPUT");
        assert_eq!(body["field"], field, "{body}");
    }
    let mut body = run_body("t", "r", "hi");
    body["messages"][0]["id"] = Value::from("m\u{7f}");
    let response = post_run(&server, "demo", &body).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["field"], "messages[0].id");
    // The same rules for ids in a path.
    for (path, field) in [
        ("/threads/a%0Ab", "threadId"),
        (&*format!("/threads/{long}/messages"), "threadId"),
        ("/runs/r%1B/cancel", "runId"),
    ] {
        let response = if path.starts_with("/runs") {
            server.post(path).sent().await
        } else {
            server.get(path).sent().await
        };
        assert_eq!(response.status(), 400, "{path}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["field"], field, "{path}");
    }
}

#[tokio::test]
async fn listing_pages_past_threads_with_the_longest_ids() {
    let server = TestServer::start().await;
    // 256 bytes each: the longest ids accepted, in multi-byte characters.
    let ids: Vec<String> = ["é", "ß", "€"]
        .iter()
        .map(|c| {
            let mut id = c.repeat(256 / c.len());
            while id.len() < 256 {
                id.push('x');
            }
            id
        })
        .collect();
    for id in &ids {
        assert_eq!(id.len(), 256);
        let response = post_run(&server, "demo", &run_body(id, "r", "hi")).await;
        assert_eq!(response.status(), 200);
        SseReader::new(response).collect().await;
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/threads?limit=1&cursor={c}"),
            None => "/threads?limit=1".to_owned(),
        };
        let (status, page) = get_json(&server, &path).await;
        assert_eq!(status, 200, "{page}");
        for thread in page["threads"].as_array().expect("threads") {
            seen.push(thread["threadId"].as_str().expect("id").to_owned());
        }
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    seen.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn requests_the_http_parser_refuses_get_our_json_errors() {
    let server = TestServer::start().await;
    for (what, request, status, code) in [
        (
            "conflicting content-length",
            &b"POST /agui/demo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!"[..],
            400,
            "MALFORMED_REQUEST",
        ),
        (
            "obs-fold",
            b"GET /agui/healthz HTTP/1.1\r\nhost: x\r\nx-a: b\r\n c\r\n\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        (
            "NUL in a header",
            b"GET /agui/healthz HTTP/1.1\r\nhost: x\r\nx-a: a\0b\r\n\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        (
            "control bytes in Last-Event-ID",
            b"GET /agui/threads/t/stream HTTP/1.1\r\nhost: x\r\nlast-event-id: 1\x01\x1b[2J\r\n\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
        (
            "bad request line",
            b"GET /agui/healthz HTTP/9.9 extra\r\nhost: x\r\n\r\n",
            400,
            "MALFORMED_REQUEST",
        ),
    ] {
        let raw = raw_exchange(&server, request).await;
        let (got, body) = json_answer(&raw);
        assert_eq!(got, status, "{what}: {raw}");
        assert_eq!(body["code"], code, "{what}: {raw}");
    }
}

#[tokio::test]
async fn a_long_uri_is_a_json_414_and_large_headers_a_json_431() {
    let server = TestServer::start().await;
    let long_path = format!("/agui/threads?cursor={}", "a".repeat(9 * 1024));
    let raw = raw_exchange(
        &server,
        format!("GET {long_path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    let (status, body) = json_answer(&raw);
    assert_eq!(
        (status, body["code"].as_str()),
        (414, Some("URI_TOO_LONG")),
        "{raw}"
    );

    // Headers over 64 KiB in all, in one header or in many.
    for headers in [
        format!("x-big: {}\r\n", "b".repeat(70 * 1024)),
        (0..90)
            .map(|i| format!("x-h{i}: {}\r\n", "c".repeat(800)))
            .collect::<String>(),
    ] {
        let raw = raw_exchange(
            &server,
            format!("GET /agui/healthz HTTP/1.1\r\nhost: x\r\n{headers}\r\n").as_bytes(),
        )
        .await;
        let (status, body) = json_answer(&raw);
        assert_eq!(status, 431, "{}", &raw[..raw.len().min(300)]);
        assert_eq!(body["code"], "HEADERS_TOO_LARGE");
    }
    // Just under the cap is served.
    let raw = raw_exchange(
        &server,
        format!(
            "GET /agui/healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-big: {}\r\n\r\n",
            "d".repeat(60 * 1024)
        )
        .as_bytes(),
    )
    .await;
    assert!(
        raw.starts_with("HTTP/1.1 200"),
        "{}",
        &raw[..raw.len().min(300)]
    );

    // Over HTTP/2 the header list is capped too (refused by the HTTP/2 layer with 431).
    let dir = temp_dir("h2-headers");
    let tls = TestServer::with(move |c| {
        c.tls = agui_serve::config::TlsMode::SelfSigned;
        c.data_dir = dir;
    })
    .await;
    let response = client()
        .get(tls.url("/healthz"))
        .header("x-big", "e".repeat(70 * 1024))
        .sent()
        .await;
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 431);
}

#[tokio::test]
async fn more_than_100_header_fields_are_a_json_431() {
    let server = TestServer::start().await;
    let headers: String = (0..101).map(|i| format!("x-h{i}: v\r\n")).collect();
    let raw = raw_exchange(
        &server,
        format!("GET /agui/healthz HTTP/1.1\r\nhost: x\r\n{headers}\r\n").as_bytes(),
    )
    .await;
    let (status, body) = json_answer(&raw);
    assert_eq!(
        (status, body["code"].as_str()),
        (431, Some("HEADERS_TOO_LARGE")),
        "{raw}"
    );
}

#[tokio::test]
async fn an_http2_connection_carries_at_most_the_configured_streams_at_once() {
    let limits = Limits {
        max_h2_streams: 2,
        ..Limits::default()
    };
    let dir = temp_dir("h2-streams");
    let server = TestServer::with_limits(
        move |c| {
            c.tls = agui_serve::config::TlsMode::SelfSigned;
            c.data_dir = dir;
        },
        limits,
    )
    .await;
    let http = client();
    // Two long streams on the one connection, each seen started.
    let mut open = Vec::new();
    for thread in ["a", "b"] {
        let response = http
            .post(server.url("/demo"))
            .bearer_auth(TOKEN)
            .json(&run_body(thread, thread, "/slow 1000 1000"))
            .sent()
            .await;
        assert_eq!(response.version(), reqwest::Version::HTTP_2);
        assert_eq!(response.status(), 200);
        let mut reader = SseReader::new(response);
        assert_eq!(reader.next().await.expect("a frame").kind(), "RUN_STARTED");
        open.push(reader);
    }
    // A third request waits for a stream to close: the server announced two at most.
    let third = tokio::spawn({
        let http = http.clone();
        let url = server.url("/healthz");
        async move { http.get(url).sent().await.status() }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!third.is_finished(), "the third stream waited");
    drop(open.remove(0));
    let status = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("served once a stream closed")
        .expect("task");
    assert_eq!(status, 200);
}
