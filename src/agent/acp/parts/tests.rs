use agent_client_protocol::v1::schema::PromptCapabilities;
use serde_json::{Value, json};

use super::*;

fn part(value: Value) -> ContentPart {
    serde_json::from_value(value).expect("a valid part")
}

fn every_capability() -> PromptCapabilities {
    PromptCapabilities::new()
        .image(true)
        .audio(true)
        .embedded_context(true)
}

/// The block of `value` (the 3rd part of message `m1`) as JSON, for an agent with
/// `capabilities`.
fn mapped(value: Value, capabilities: &PromptCapabilities) -> Result<Value, Refusal> {
    let block = block(&part(value), "m1", 3, capabilities)?;
    Ok(serde_json::to_value(block).expect("serializes"))
}

fn data(kind: &str, value: &str, mime_type: &str) -> Value {
    json!({"type": kind, "source": {"type": "data", "value": value, "mimeType": mime_type}})
}

fn url(kind: &str, value: &str, mime_type: Option<&str>) -> Value {
    let mut source = json!({"type": "url", "value": value});
    if let Some(mime_type) = mime_type {
        source["mimeType"] = json!(mime_type);
    }
    json!({"type": kind, "source": source})
}

#[test]
fn every_part_becomes_the_block_acp_has_for_it() {
    // "# Hi\n" and "{\"a\":1}" in base64.
    let cases = [
        (
            json!({"type": "text", "text": "hi"}),
            json!({"type": "text", "text": "hi"}),
        ),
        (
            data("image", "iVBORw0K", "image/png"),
            json!({"type": "image", "data": "iVBORw0K", "mimeType": "image/png"}),
        ),
        (
            data("audio", "UklGRg==", "audio/wav"),
            json!({"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"}),
        ),
        (
            data("document", "JVBERi0x", "application/pdf"),
            json!({"type": "resource", "resource": {"blob": "JVBERi0x",
                "mimeType": "application/pdf", "uri": "agui:message/m1/content/3"}}),
        ),
        (
            data("document", "IyBIaQo=", "text/markdown"),
            json!({"type": "resource", "resource": {"text": "# Hi\n",
                "mimeType": "text/markdown", "uri": "agui:message/m1/content/3"}}),
        ),
        (
            data(
                "document",
                "eyJhIjoxfQ==",
                "application/json; charset=utf-8",
            ),
            json!({"type": "resource", "resource": {"text": "{\"a\":1}",
                "mimeType": "application/json; charset=utf-8",
                "uri": "agui:message/m1/content/3"}}),
        ),
        (
            // A text type whose data is not UTF-8 goes as it came.
            data("document", "//79", "text/plain"),
            json!({"type": "resource", "resource": {"blob": "//79",
                "mimeType": "text/plain", "uri": "agui:message/m1/content/3"}}),
        ),
        (
            data("video", "AAAAIGZ0", "video/mp4"),
            json!({"type": "resource", "resource": {"blob": "AAAAIGZ0",
                "mimeType": "video/mp4", "uri": "agui:message/m1/content/3"}}),
        ),
        (
            url(
                "image",
                "https://x.test/img/cat.png?size=2",
                Some("image/png"),
            ),
            json!({"type": "resource_link", "name": "cat.png",
                "uri": "https://x.test/img/cat.png?size=2", "mimeType": "image/png"}),
        ),
        (
            url("audio", "https://x.test/a.mp3", None),
            json!({"type": "resource_link", "name": "a.mp3", "uri": "https://x.test/a.mp3"}),
        ),
        (
            url("document", "https://x.test/", Some("text/html")),
            json!({"type": "resource_link", "name": "https://x.test/",
                "uri": "https://x.test/", "mimeType": "text/html"}),
        ),
        (
            url("video", "s3://bucket/clips/v.mp4", None),
            json!({"type": "resource_link", "name": "v.mp4", "uri": "s3://bucket/clips/v.mp4"}),
        ),
    ];
    for (part, expected) in cases {
        let got = mapped(part.clone(), &every_capability());
        assert_eq!(got, Ok(expected), "{part}");
    }
}

#[test]
fn a_binary_part_goes_by_its_type() {
    let cases = [
        (
            json!({"type": "binary", "mimeType": "image/jpeg", "data": "/9j/"}),
            json!({"type": "image", "data": "/9j/", "mimeType": "image/jpeg"}),
        ),
        (
            json!({"type": "binary", "mimeType": "Audio/OGG", "data": "T2dn"}),
            json!({"type": "audio", "data": "T2dn", "mimeType": "Audio/OGG"}),
        ),
        (
            json!({"type": "binary", "mimeType": "application/pdf", "data": "JVBERi0x",
                "filename": "Q3 report.pdf"}),
            json!({"type": "resource", "resource": {"blob": "JVBERi0x",
                "mimeType": "application/pdf",
                "uri": "agui:message/m1/content/3/Q3%20report.pdf"}}),
        ),
        (
            json!({"type": "binary", "mimeType": "application/pdf",
                "url": "https://x.test/r?id=7", "filename": "report.pdf"}),
            json!({"type": "resource_link", "name": "report.pdf",
                "uri": "https://x.test/r?id=7", "mimeType": "application/pdf"}),
        ),
        (
            // Data wins over a URL.
            json!({"type": "binary", "mimeType": "image/png", "data": "iVBO",
                "url": "https://x.test/p.png"}),
            json!({"type": "image", "data": "iVBO", "mimeType": "image/png"}),
        ),
    ];
    for (part, expected) in cases {
        let got = mapped(part.clone(), &every_capability());
        assert_eq!(got, Ok(expected), "{part}");
    }
}

#[test]
fn a_data_url_is_data_not_a_link() {
    let cases = [
        (
            url("image", "data:image/gif;base64,R0lGOD", Some("image/png")),
            json!({"type": "image", "data": "R0lGOD", "mimeType": "image/gif"}),
        ),
        (
            url("audio", "DATA:;BASE64,UklGRg==", Some("audio/wav")),
            json!({"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"}),
        ),
        (
            url("document", "data:,hello%20there", None),
            json!({"type": "resource", "resource": {"text": "hello there",
                "mimeType": "text/plain", "uri": "agui:message/m1/content/3"}}),
        ),
        (
            url("document", "data:application/octet-stream,%00%FF", None),
            json!({"type": "resource", "resource": {"blob": "AP8=",
                "mimeType": "application/octet-stream", "uri": "agui:message/m1/content/3"}}),
        ),
    ];
    for (part, expected) in cases {
        let got = mapped(part.clone(), &every_capability());
        assert_eq!(got, Ok(expected), "{part}");
    }
}

#[test]
fn inline_data_the_agent_does_not_take_is_refused_naming_the_capability() {
    let none = PromptCapabilities::new();
    let cases = [
        (
            data("image", "iVBO", "image/png"),
            "an image part (image/png): agent \"a\" does not accept images (its ACP \
             promptCapabilities.image is false)",
        ),
        (
            json!({"type": "binary", "mimeType": "image/png", "data": "iVBO"}),
            "a binary part (image/png): agent \"a\" does not accept images",
        ),
        (
            data("audio", "UklGRg==", "audio/wav"),
            "an audio part (audio/wav): agent \"a\" does not accept audio (its ACP \
             promptCapabilities.audio is false)",
        ),
        (
            data("document", "JVBERi0x", "application/pdf"),
            "a document part (application/pdf): agent \"a\" does not accept embedded files \
             (its ACP promptCapabilities.embeddedContext is false)",
        ),
        (
            url("video", "data:video/mp4;base64,AAAA", None),
            "a video part: agent \"a\" does not accept embedded files",
        ),
    ];
    for (value, reason) in cases {
        let refusal = mapped(value.clone(), &none).expect_err("refused");
        let said = refusal.reason("a");
        assert!(said.starts_with(reason), "{value}: {said}");
        assert!(said.ends_with("send it as a URL, which goes as a link, or leave it out"));
        assert_eq!(check(&part(value), Some(&none)), Err(refusal));
    }
    // Each capability lets through exactly its own blocks.
    let audio_only = PromptCapabilities::new().audio(true);
    assert!(mapped(data("audio", "UklGRg==", "audio/wav"), &audio_only).is_ok());
    assert!(mapped(data("image", "iVBO", "image/png"), &audio_only).is_err());
    assert!(mapped(data("document", "JVBERi0x", "application/pdf"), &audio_only).is_err());
}

#[test]
fn text_and_links_go_to_every_agent() {
    let none = PromptCapabilities::new();
    for value in [
        json!({"type": "text", "text": "hi"}),
        url("image", "https://x.test/cat.png", Some("image/png")),
        url("audio", "https://x.test/a.wav", None),
        url("document", "https://x.test/d.pdf", Some("application/pdf")),
        json!({"type": "binary", "mimeType": "image/png", "url": "https://x.test/p.png"}),
    ] {
        assert!(mapped(value.clone(), &none).is_ok(), "{value}");
        assert_eq!(check(&part(value), Some(&none)), Ok(()));
    }
}

#[test]
fn a_file_id_is_refused_whatever_the_agent_takes() {
    let cases = [
        (
            json!({"type": "document", "source": {"type": "file", "value": "file-123",
                "mimeType": "application/pdf"}}),
            "a document part (application/pdf): a file id names a file only the client can \
             read; send the file's data or a URL",
        ),
        (
            json!({"type": "binary", "mimeType": "image/png", "id": "file-9"}),
            "a binary part (image/png): a file id names a file only the client can read; \
             send the file's data or a URL",
        ),
        (
            json!({"type": "binary", "mimeType": "image/png"}),
            "a binary part (image/png): the part has no data, URL or id",
        ),
    ];
    for (value, reason) in cases {
        let refusal = mapped(value.clone(), &every_capability()).expect_err("refused");
        assert_eq!(refusal.reason("a"), reason);
        // Known before the agent's capabilities are.
        assert_eq!(check(&part(value), None), Err(refusal));
    }
}

#[test]
fn with_the_capabilities_unknown_only_what_no_agent_takes_is_refused() {
    for value in [
        data("image", "iVBO", "image/png"),
        data("audio", "UklGRg==", "audio/wav"),
        data("document", "JVBERi0x", "application/pdf"),
    ] {
        assert_eq!(check(&part(value.clone()), None), Ok(()), "{value}");
    }
}

#[test]
fn a_message_id_in_an_inline_uri_is_percent_encoded() {
    assert_eq!(
        inline_uri("a/b c.d", 0, Some("x/y.txt")),
        "agui:message/a%2Fb%20c.d/content/0/x%2Fy.txt"
    );
}
