//! Runs streamed over real sockets: lifecycle, framing, headers, profiles, HTTP/2 over TLS,
//! keep-alives, cancel, and the header-read timeout.

mod support;

use std::time::{Duration, Instant};

use agui_serve::config::TlsMode;
use agui_serve::http::Limits;
use agui_serve::runtime::EventId;
use serde_json::Value;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn plain_run_streams_a_valid_segment_with_stream_headers() {
    let server = TestServer::start().await;
    let response = post_run(&server, "demo", &run_body("t1", "r1", "hello world")).await;
    assert_eq!(response.status(), 200);
    let h = response.headers();
    assert_eq!(h["content-type"], "text/event-stream");
    assert_eq!(h["cache-control"], "no-cache, no-store, no-transform");
    assert_eq!(h["x-accel-buffering"], "no");
    assert_eq!(h["vary"], "accept");
    assert!(h.get("content-encoding").is_none());
    let frames = SseReader::new(response).collect().await;
    assert_valid_segment(&frames);
    let text: String = frames
        .iter()
        .filter(|f| f.kind() == "TEXT_MESSAGE_CONTENT")
        .map(|f| f.data["delta"].as_str().expect("delta").to_owned())
        .collect();
    assert_eq!(text, "You said: hello world");
    assert!(
        frames
            .iter()
            .filter(|f| f.kind() == "TEXT_MESSAGE_CONTENT")
            .count()
            > 1,
        "several deltas"
    );
    assert_eq!(frames[0].data["threadId"], "t1");
    assert_eq!(frames[0].data["runId"], "r1");
    for f in &frames {
        assert!(f.data["timestamp"].is_u64(), "integer ms timestamp");
    }
}

#[tokio::test]
async fn event_ids_strictly_increase_within_a_thread_across_runs() {
    let server = TestServer::start().await;
    let a = SseReader::new(post_run(&server, "demo", &run_body("same", "r1", "one")).await)
        .collect()
        .await;
    let mut body = run_body("same", "r2", "two");
    body["messages"] = serde_json::json!([
        {"id": "r1-u", "role": "user", "content": "one"},
        {"id": "r2-u", "role": "user", "content": "two"}
    ]);
    let b = SseReader::new(post_run(&server, "demo", &body).await)
        .collect()
        .await;
    let ids: Vec<EventId> = a
        .iter()
        .chain(b.iter())
        .map(|f| EventId::parse(f.id.as_deref().expect("id")).expect("well-formed id"))
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert!(
        ids.iter()
            .all(|id| id.epoch == ids[0].epoch && id.tag == ids[0].tag),
        "one boot epoch, one thread"
    );
}

#[tokio::test]
async fn think_streams_reasoning_then_reply() {
    let server = TestServer::start().await;
    let frames = SseReader::new(post_run(&server, "demo", &run_body("t", "r", "/think why")).await)
        .collect()
        .await;
    assert_valid_segment(&frames);
    let k = kinds(&frames);
    let reasoning = k
        .iter()
        .position(|t| t == "REASONING_START")
        .expect("reasoning");
    let text = k
        .iter()
        .position(|t| t == "TEXT_MESSAGE_START")
        .expect("text");
    assert!(reasoning < text);
    assert!(k.contains(&"REASONING_MESSAGE_CONTENT".to_owned()));
}

#[tokio::test]
async fn fail_ends_with_run_error_carrying_the_text() {
    let server = TestServer::start().await;
    let frames =
        SseReader::new(post_run(&server, "demo", &run_body("t", "r", "/fail it broke")).await)
            .collect()
            .await;
    assert_valid_segment(&frames);
    let last = frames.last().expect("frame");
    assert_eq!(last.kind(), "RUN_ERROR");
    assert_eq!(last.data["message"], "it broke");
    assert!(last.data["code"].is_string());
}

#[tokio::test]
async fn a_failed_run_leaves_its_error_in_the_transcript_for_a_reload() {
    let server = TestServer::start().await;
    let frames =
        SseReader::new(post_run(&server, "demo", &run_body("e", "r1", "/fail it broke")).await)
            .collect()
            .await;
    // The live stream is the error alone: no message for it.
    assert_eq!(
        kinds(&frames),
        ["RUN_STARTED", "STATE_SNAPSHOT", "RUN_ERROR"]
    );
    let error =
        serde_json::json!({"id": "r1-error", "role": "assistant", "content": "Error: it broke"});
    let (_, transcript) = get_json(&server, "/threads/e/messages").await;
    assert_eq!(transcript["messages"][1], error, "{transcript}");
    // A reloaded page gets it with the history.
    let hydration = SseReader::new(server.get("/threads/e/stream").sent().await)
        .collect()
        .await;
    let snapshot = hydration
        .iter()
        .find(|f| f.kind() == "MESSAGES_SNAPSHOT")
        .expect("snapshot");
    assert_eq!(snapshot.data["messages"][1], error);
    // A live client (which never saw it) and a reloaded one (which sends it back) both
    // go on without a copy of it.
    let mut next = run_body("e", "r2", "again");
    next["messages"] = serde_json::json!([
        {"id": "r1-u", "role": "user", "content": "/fail it broke"},
        {"id": "r2-u", "role": "user", "content": "again"},
    ]);
    let frames = SseReader::new(post_run(&server, "demo", &next).await)
        .collect()
        .await;
    assert_eq!(text_of(&frames), "You said: again");
    let mut reloaded = run_body("e", "r3", "once more");
    reloaded["messages"] = serde_json::json!([
        {"id": "r1-u", "role": "user", "content": "/fail it broke"},
        error,
        {"id": "r2-u", "role": "user", "content": "again"},
        {"id": "r3-u", "role": "user", "content": "once more"},
    ]);
    let frames = SseReader::new(post_run(&server, "demo", &reloaded).await)
        .collect()
        .await;
    assert_eq!(text_of(&frames), "You said: once more");
    let (_, transcript) = get_json(&server, "/threads/e/messages").await;
    let ids: Vec<&str> = transcript["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["id"].as_str().expect("id"))
        .collect();
    assert_eq!(
        ids.iter().filter(|id| **id == "r1-error").count(),
        1,
        "{ids:?}"
    );
    assert_eq!(ids[..3], ["r1-u", "r1-error", "r2-u"], "{ids:?}");
    // It is stored: a restarted daemon has it in the same place.
    let data = server.data_dir.clone();
    server.stop().await;
    let server = TestServer::with(move |c| c.data_dir = data).await;
    let (_, transcript) = get_json(&server, "/threads/e/messages").await;
    assert_eq!(transcript["messages"][1], error, "{transcript}");
}

#[tokio::test]
async fn slow_chunks_arrive_as_they_are_produced() {
    let server = TestServer::start().await;
    let response = post_run(&server, "demo", &run_body("t", "r", "/slow 8 100")).await;
    let mut reader = SseReader::new(response);
    let mut arrivals = Vec::new();
    while let Some(frame) = reader.next().await {
        if frame.kind() == "TEXT_MESSAGE_CONTENT" {
            arrivals.push(Instant::now());
        }
    }
    assert_eq!(arrivals.len(), 8);
    // Produced 100 ms apart: a buffered response would deliver them all at once.
    let spread = arrivals[7] - arrivals[0];
    assert!(spread >= Duration::from_millis(350), "spread {spread:?}");
}

#[tokio::test]
async fn keep_alive_comment_after_silence() {
    let server = TestServer::with(|c| c.keep_alive = Duration::from_millis(40)).await;
    let response = post_run(&server, "demo", &run_body("t", "r", "/slow 3 300")).await;
    let mut reader = SseReader::new(response);
    let mut frames = Vec::new();
    while let Some(f) = reader.next().await {
        frames.push(f);
    }
    assert_valid_segment(&frames);
    assert!(
        reader.keep_alives >= 2,
        "keep-alives: {}",
        reader.keep_alives
    );
}

#[tokio::test]
async fn legacy_client_gets_its_profile() {
    let server = TestServer::start().await;
    let frames = SseReader::new(post_run(&server, "demo", &legacy_body("t", "r", "hi")).await)
        .collect()
        .await;
    let last = frames.last().expect("frame");
    assert_eq!(last.kind(), "RUN_FINISHED");
    assert!(last.data.get("outcome").is_none());
}

#[tokio::test]
async fn cancel_from_another_connection_ends_the_stream_per_profile() {
    let server = TestServer::start().await;
    for (body, legacy) in [
        (run_body("c1", "run-v1", "/slow 200 20"), false),
        (legacy_body("c2", "run-legacy", "/slow 200 20"), true),
    ] {
        let run_id = body["runId"].as_str().expect("run id").to_owned();
        let mut reader = SseReader::new(post_run(&server, "demo", &body).await);
        assert_eq!(reader.next().await.expect("frame").kind(), "RUN_STARTED");
        let response = server.post(&format!("/runs/{run_id}/cancel")).sent().await;
        assert_eq!(response.status(), 202);
        let mut rest = vec![];
        while let Some(f) = reader.next().await {
            rest.push(f);
        }
        let last = rest.last().expect("terminal");
        if legacy {
            assert_eq!(last.kind(), "RUN_ERROR");
            assert_eq!(last.data["code"], "cancelled");
        } else {
            assert_eq!(last.kind(), "RUN_FINISHED");
            assert_eq!(last.data["outcome"]["type"], "cancelled");
        }
        assert!(
            !kinds(&rest).contains(&"TEXT_MESSAGE_START".to_owned())
                || kinds(&rest).contains(&"TEXT_MESSAGE_END".to_owned())
        );
    }
}

#[tokio::test]
async fn http2_over_tls_with_a_self_signed_certificate_kept_across_restarts() {
    let data_dir = temp_dir("tls");
    let dir = data_dir.clone();
    let server = TestServer::with(move |c| {
        c.tls = TlsMode::SelfSigned;
        c.data_dir = dir;
    })
    .await;
    assert!(server.base.starts_with("https://"));
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("client");
    a_run_streams_over_http2(&http, &server, "t").await;
    let cert = data_dir.join("tls/cert.pem");
    let first = std::fs::read(&cert).expect("certificate written");
    server.stop().await;

    let dir = data_dir.clone();
    let again = TestServer::with(move |c| {
        c.tls = TlsMode::SelfSigned;
        c.data_dir = dir;
    })
    .await;
    assert_eq!(std::fs::read(&cert).expect("certificate"), first, "reused");
    let response = http.get(again.url("/healthz")).sent().await;
    assert_eq!(response.status(), 200);
}

async fn closed_within(stream: &mut (impl AsyncReadExt + Unpin), bound: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + bound;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test]
async fn connections_that_never_finish_their_headers_are_closed() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = TestServer::with_limits(|_| {}, limits).await;

    // Partial headers, then silence.
    let mut partial = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    partial
        .write_all(b"POST /agui/demo HTTP/1.1\r\nhost: x\r\nx-slow: ")
        .await
        .expect("write");
    assert!(
        closed_within(&mut partial, Duration::from_secs(5)).await,
        "partial headers"
    );

    // Nothing at all.
    let mut silent = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)).await,
        "silent"
    );

    // A second request on a kept-alive connection that stalls mid-headers.
    let mut keep = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    keep.write_all(b"GET /agui/healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 2048];
    let n = keep.read(&mut buf).await.expect("read");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    keep.write_all(b"GET /agui/healthz HTTP/1.1\r\nho")
        .await
        .expect("write");
    assert!(
        closed_within(&mut keep, Duration::from_secs(5)).await,
        "second request"
    );
}

#[tokio::test]
async fn tls_connections_that_never_handshake_are_closed() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let dir = temp_dir("tls-slow");
    let server = TestServer::with_limits(
        move |c| {
            c.tls = TlsMode::SelfSigned;
            c.data_dir = dir;
        },
        limits,
    )
    .await;
    let mut silent = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    assert!(closed_within(&mut silent, Duration::from_secs(5)).await);
}

#[tokio::test]
async fn head_requests_get_headers_and_no_body_over_http2_and_http1() {
    let dir = temp_dir("head");
    let server = TestServer::with(move |c| {
        c.tls = TlsMode::SelfSigned;
        c.data_dir = dir;
    })
    .await;
    let http = client();
    // Routes that answer HEAD, and ones that refuse it (405, 404, 401): none sends a body.
    for (path, status) in [
        ("/healthz", 200),
        ("/readyz", 200),
        ("/info", 405),
        ("/nowhere/at/all", 404),
        ("/threads/t", 405),
    ] {
        let response = http.head(server.url(path)).sent().await;
        assert_eq!(response.version(), reqwest::Version::HTTP_2, "{path}");
        assert_eq!(response.status(), status, "{path}");
        if status == 200 {
            assert_eq!(response.headers()["content-type"], "application/json");
        }
        let body = response.bytes().await.expect("no protocol error");
        assert!(body.is_empty(), "{path}: {body:?}");
    }

    // HTTP/1.1: the answer to HEAD carries the GET's Content-Length and no body, so the
    // next response on the connection starts right after the headers.
    let plain = TestServer::start().await;
    let mut stream = tokio::net::TcpStream::connect(plain.addr)
        .await
        .expect("connect");
    stream
        .write_all(b"HEAD /agui/healthz HTTP/1.1\r\nhost: x\r\n\r\nGET /agui/no/such/route HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    stream.read_to_end(&mut got).await.expect("read");
    let text = String::from_utf8_lossy(&got);
    let (head, rest) = text.split_once("\r\n\r\n").expect("head response");
    assert!(head.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        head.to_ascii_lowercase().contains("content-length: "),
        "{head}"
    );
    assert!(rest.starts_with("HTTP/1.1 404"), "{text}");
}

#[tokio::test]
async fn cleartext_http2_with_prior_knowledge_streams_a_run() {
    let server = TestServer::start().await;
    let http = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    a_run_streams_over_http2(&http, &server, "h2c").await;
}

/// A run on `thread`, sent with `http`, comes back over HTTP/2 as a valid segment.
async fn a_run_streams_over_http2(http: &reqwest::Client, server: &TestServer, thread: &str) {
    let response = http
        .post(server.url("/demo"))
        .bearer_auth(TOKEN)
        .json(&run_body(thread, "r", "over h2"))
        .sent()
        .await;
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    assert_valid_segment(&frames);
}

/// Writes `pieces` with a pause between them, then reads what the server sends first.
async fn sent_in_pieces(server: &TestServer, pieces: &[&[u8]]) -> Vec<u8> {
    let mut stream = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    for piece in pieces {
        stream.write_all(piece).await.expect("write");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut got = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut got))
        .await
        .expect("the server answers")
        .expect("read");
    got.truncate(n);
    got
}

#[tokio::test]
async fn a_connection_is_told_apart_by_its_first_bytes_however_they_arrive() {
    let server = TestServer::start().await;
    // HTTP/2's preface split inside itself: the server answers with HTTP/2 frames (its
    // SETTINGS frame: a 9-byte header whose type byte is 4), not an HTTP/1.1 error.
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let got = sent_in_pieces(&server, &[&preface[..3], &preface[3..10], &preface[10..]]).await;
    assert!(got.len() >= 9, "{got:?}");
    assert_eq!(got[3], 4, "a SETTINGS frame first: {got:?}");
    assert!(!got.starts_with(b"HTTP/1.1"), "{got:?}");

    // An HTTP/1.1 request whose first byte comes alone (it starts like the preface).
    let got = sent_in_pieces(
        &server,
        &[b"G", b"ET /agui/healthz HTTP/1.1\r\nhost: x\r\n\r\n"],
    )
    .await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let got = sent_in_pieces(
        &server,
        &[
            b"P",
            b"OST /agui/healthz HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
        ],
    )
    .await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 "), "{got}");
}

/// A connection that has not sent a byte (or not finished its TLS handshake) when the
/// daemon shuts down is closed then, as hyper closes an idle one: it does not hold the
/// shutdown for its header timeout.
#[tokio::test]
async fn a_connection_that_sent_nothing_does_not_hold_the_shutdown() {
    let limits = Limits {
        header_read_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    for tls in [false, true] {
        let dir = temp_dir("silent-shutdown");
        let server = TestServer::with_limits(
            move |c| {
                c.data_dir = dir;
                if tls {
                    c.tls = TlsMode::SelfSigned;
                }
            },
            limits,
        )
        .await;
        let mut silent = tokio::net::TcpStream::connect(server.addr)
            .await
            .expect("connect");
        // Served: the connection is in the daemon's hands before it stops.
        let response = server.get("/healthz").sent().await;
        assert_eq!(response.status(), 200);
        let stopped = tokio::time::timeout(Duration::from_secs(20), server.stop()).await;
        assert!(
            stopped.is_ok(),
            "tls={tls}: the shutdown waited for a connection that sent nothing"
        );
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut rest))
            .await
            .expect("the silent connection is closed");
        assert!(read.is_ok() || tls, "tls={tls}: {read:?}");
    }
}

/// A request refused before its body is read (a forgotten token) shows its answer to
/// curl, as it is typed: over HTTP/2 the stream ends cleanly instead of being reset while
/// curl still sends ("Stream error in the HTTP/2 framing layer"), with a 20 KB body or
/// none, and over HTTP/1.1.
#[tokio::test]
async fn a_refusal_before_the_body_is_read_reaches_curl_whole() {
    let dir = temp_dir("refused-body");
    let server = TestServer::with(move |c| {
        c.tls = TlsMode::SelfSigned;
        c.data_dir = dir;
    })
    .await;
    let body = temp_dir("refused-body-file").join("body.json");
    std::fs::write(&body, vec![b'a'; 20 * 1024]).expect("body");
    let body = format!("@{}", body.display());
    let url = server.url("/demo");
    for (protocol, data) in [
        ("--http2", body.as_str()),
        ("--http2", ""),
        ("--http1.1", body.as_str()),
    ] {
        let mut failures = Vec::new();
        for _ in 0..100 {
            let url = url.clone();
            let data = data.to_owned();
            let out = tokio::task::spawn_blocking(move || {
                std::process::Command::new("curl")
                    .args([
                        "-sk",
                        protocol,
                        "-X",
                        "POST",
                        "-H",
                        "content-type: application/json",
                    ])
                    .args(["--data-binary", &data, "-w", "\n%{http_code}", &url])
                    .output()
                    .expect("curl runs")
            })
            .await
            .expect("joined");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let (json, status) = text.rsplit_once('\n').unwrap_or(("", &text));
            let whole = out.status.success()
                && status == "401"
                && serde_json::from_str::<Value>(json).is_ok_and(|j| j["code"] == "UNAUTHORIZED");
            if !whole {
                failures.push(format!("exit {:?}: {text:?}", out.status.code()));
            }
        }
        assert!(
            failures.is_empty(),
            "{protocol} with {}: {} of 100 failed: {:?}",
            if data.is_empty() {
                "no body"
            } else {
                "a 20 KB body"
            },
            failures.len(),
            &failures[..failures.len().min(3)]
        );
    }
}
