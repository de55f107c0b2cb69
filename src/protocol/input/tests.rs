//! The decoder's tests: what `RunAgentInput` accepts and how it names what it refuses.
use super::*;

fn err(body: &str) -> InputError {
    match decode_run_input(body.as_bytes()) {
        Ok(input) => panic!("expected an error, got {input:?}"),
        Err(err) => err,
    }
}

#[test]
fn minimal_input_decodes() {
    let input = decode_run_input(br#"{"threadId":"t","runId":"r","messages":[]}"#).expect("valid");
    assert_eq!(input.thread_id, "t");
    assert!(input.protocol_version.is_none());
    assert!(input.tools.is_empty());
}

#[test]
fn nulls_are_absent() {
    let input = decode_run_input(
        br#"{"threadId":"t","runId":"r","messages":[],"state":null,"tools":null,"context":null,"resume":null,"forwardedProps":null}"#,
    )
    .expect("valid");
    assert!(input.state.is_none());
}

#[test]
fn missing_top_level_field_is_named() {
    let e = err(r#"{"threadId":"t","messages":[]}"#);
    assert_eq!(e.field.as_deref(), Some("runId"));
    assert!(e.message.contains("runId"), "{}", e.message);
}

#[test]
fn bad_message_role_is_named_with_its_index() {
    let e = err(
        r#"{"threadId":"t","runId":"r","messages":[{"id":"1","role":"user","content":"x"},{"id":"2","role":"wizard","content":"x"}]}"#,
    );
    assert_eq!(
        e.field.as_deref(),
        Some("messages[1].role"),
        "{}",
        e.message
    );
    assert!(e.message.contains("wizard"), "{}", e.message);
}

#[test]
fn missing_nested_field_is_named() {
    let e =
        err(r#"{"threadId":"t","runId":"r","messages":[{"id":"1","role":"tool","content":"x"}]}"#);
    assert_eq!(
        e.field.as_deref(),
        Some("messages[0].toolCallId"),
        "{}",
        e.message
    );
}

#[test]
fn every_role_and_part_decodes_and_round_trips() {
    let body = r#"{"threadId":"t","runId":"r","protocolVersion":"1.0","messages":[
        {"id":"d","role":"developer","content":"dev"},
        {"id":"s","role":"system","content":"sys"},
        {"id":"u","role":"user","content":[
            {"type":"text","text":"hi"},
            {"type":"image","source":{"type":"data","value":"AAAA","mimeType":"image/png"}},
            {"type":"audio","source":{"type":"url","value":"https://x/a.mp3"}},
            {"type":"video","source":{"type":"file","value":"f1"}},
            {"type":"document","source":{"type":"url","value":"https://x/d.pdf","mimeType":"application/pdf"}},
            {"type":"binary","mimeType":"image/png","data":"AAAA"}
        ]},
        {"id":"a","role":"assistant","toolCalls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
        {"id":"tm","role":"tool","content":"ok","toolCallId":"c1"},
        {"id":"ac","role":"activity","activityType":"progress","content":{"p":1}},
        {"id":"re","role":"reasoning","content":"hmm"}
    ],"tools":[{"name":"f","description":"d","parameters":{"type":"object"}}],
    "context":[{"description":"c","value":"v"}],
    "resume":[{"interruptId":"i","status":"resolved","payload":{"ok":true}}],
    "unknownField":1}"#;
    let input = decode_run_input(body.as_bytes()).expect("valid");
    assert_eq!(input.messages.len(), 7);
    let round = serde_json::to_value(&input.messages).expect("serializes");
    let original: Value = serde_json::from_str(body).expect("json");
    assert_eq!(round, original["messages"]);
}

#[test]
fn empty_thread_id_is_rejected() {
    let e = err(r#"{"threadId":"","runId":"r","messages":[]}"#);
    assert_eq!(e.field.as_deref(), Some("threadId"));
}

#[test]
fn ids_with_control_characters_or_over_the_limit_are_refused_naming_the_field() {
    let long = "é".repeat(MAX_ID_BYTES / 2 + 1);
    let at_limit = "é".repeat(MAX_ID_BYTES / 2);
    for (body, field) in [
        (r#"{"threadId":"t\r\nforged","runId":"r","messages":[]}"#.to_owned(), "threadId"),
        (r#"{"threadId":"t","runId":"r\u001b[31m","messages":[]}"#.to_owned(), "runId"),
        (r#"{"threadId":"t","runId":"r","parentRunId":"p\u007f","messages":[]}"#.to_owned(), "parentRunId"),
        (format!(r#"{{"threadId":"{long}","runId":"r","messages":[]}}"#), "threadId"),
        (r#"{"threadId":"t","runId":"r","messages":[{"id":"m\u0000","role":"user","content":"x"}]}"#.to_owned(), "messages[0].id"),
        (r#"{"threadId":"t","runId":"r","messages":[{"id":"a","role":"assistant","toolCalls":[{"id":"c\n","type":"function","function":{"name":"f","arguments":"{}"}}]}]}"#.to_owned(), "messages[0].toolCalls[0].id"),
        (r#"{"threadId":"t","runId":"r","messages":[{"id":"x","role":"tool","content":"ok","toolCallId":"c\u0085"}]}"#.to_owned(), "messages[0].toolCallId"),
        (r#"{"threadId":"t","runId":"r","messages":[],"resume":[{"interruptId":"i\t","status":"cancelled"}]}"#.to_owned(), "resume[0].interruptId"),
    ] {
        let e = err(&body);
        assert_eq!(e.field.as_deref(), Some(field), "{body}: {}", e.message);
        assert!(e.message.contains(field), "{}", e.message);
    }
    let ok = format!(r#"{{"threadId":"{at_limit}","runId":"r","messages":[]}}"#);
    assert!(decode_run_input(ok.as_bytes()).is_ok());
}

#[test]
fn errors_name_the_whole_path_in_plain_words() {
    let base =
        |messages: &str| format!(r#"{{"threadId":"t","runId":"r","messages":[{messages}]}}"#);
    for (body, field, says) in [
        (
            base(r#"{"id":"1","role":"user","content":5}"#),
            Some("messages[0].content"),
            "expected a string or an array of content parts, found a number",
        ),
        (
            base(
                r#"{"id":"1","role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{"type":"data","value":1,"mimeType":"image/png"}}]}"#,
            ),
            Some("messages[0].content[1].source.value"),
            "expected a string, found the number 1",
        ),
        (
            base(
                r#"{"id":"1","role":"user","content":[{"type":"image","source":{"type":"data","value":"AA"}}]}"#,
            ),
            Some("messages[0].content[0].source.mimeType"),
            "is required",
        ),
        (
            base(r#"{"id":"1","role":"user","content":[{"type":"gif"}]}"#),
            Some("messages[0].content[0].type"),
            "unknown value \"gif\"",
        ),
        (
            base(
                r#"{"id":"1","role":"assistant","toolCalls":[{"id":"c","type":"function","function":{"name":"f","arguments":{}}}]}"#,
            ),
            Some("messages[0].toolCalls[0].function.arguments"),
            "expected a string, found an object",
        ),
        (
            base(r#"{"id":"1","content":"x"}"#),
            Some("messages[0].role"),
            "is required",
        ),
        (
            base(r#"{"id":1,"role":"user","content":"x"}"#),
            Some("messages[0].id"),
            "expected a string, found the number 1",
        ),
        (
            r#"{"threadId":5,"runId":"r","messages":[]}"#.to_owned(),
            Some("threadId"),
            "expected a string, found the number 5",
        ),
        (
            r#"{"threadId":"t","runId":"r","messages":{}}"#.to_owned(),
            Some("messages"),
            "expected an array, found an object",
        ),
        (
            r#"{"threadId":"t","runId":"r","messages":[{"id":"1","role":"user","content":"x""#
                .to_owned(),
            None,
            "ends before its JSON is complete",
        ),
        (
            "not json".to_owned(),
            None,
            "not valid JSON (line 1, column 2)",
        ),
    ] {
        let e = err(&body);
        assert_eq!(e.field.as_deref(), field, "{body}: {}", e.message);
        assert!(e.message.contains(says), "{body}: {}", e.message);
        for internal in ["untagged", "EOF", "ident", "`?`", "\u{1}", "variant"] {
            assert!(!e.message.contains(internal), "{body}: {}", e.message);
        }
    }
}

#[test]
fn not_json_is_rejected_without_a_field() {
    let e = err("nope");
    assert_eq!(e.field, None);
}
