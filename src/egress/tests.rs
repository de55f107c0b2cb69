use super::*;

fn egress(allow: &[&str], deny: &[&str], resolve: &[(&str, &str)]) -> Egress {
    Egress::new(&EgressConfig {
        allow: allow.iter().map(|s| (*s).to_owned()).collect(),
        deny: deny.iter().map(|s| (*s).to_owned()).collect(),
        resolve: resolve
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    })
    .expect("valid")
}

fn allowed(e: &Egress, host: &str, port: u16) -> bool {
    matches!(e.decide(host, port), Verdict::Allowed(_))
}

#[test]
fn names_subdomains_ports_and_deny_decide_as_documented() {
    let e = egress(
        &[
            "registry.npmjs.org",
            "*.githubusercontent.com:443",
            "10.0.0.5",
        ],
        &["evil.githubusercontent.com"],
        &[],
    );
    assert!(allowed(&e, "registry.npmjs.org", 443));
    assert!(allowed(&e, "registry.npmjs.org", 80), "no port: any port");
    assert!(allowed(&e, "raw.githubusercontent.com", 443));
    assert!(allowed(&e, "a.b.githubusercontent.com", 443));
    assert!(
        !allowed(&e, "raw.githubusercontent.com", 80),
        "the port is the rule's"
    );
    assert!(
        !allowed(&e, "githubusercontent.com", 443),
        "*. is below, not the name"
    );
    assert!(!allowed(&e, "xgithubusercontent.com", 443));
    assert!(!allowed(&e, "evil.githubusercontent.com", 443), "deny wins");
    assert!(!allowed(&e, "registry.npmjs.org.evil.com", 443));
    assert!(!allowed(&e, "example.com", 443));
    match e.decide("evil.githubusercontent.com", 443) {
        Verdict::Denied(why) => assert!(why.contains("egress.deny"), "{why}"),
        other => panic!("{other:?}"),
    }
    match e.decide("example.com", 443) {
        Verdict::Denied(why) => assert!(why.contains("not in egress.allow"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(allowed(&e, "10.0.0.5", 22));
    let any = egress(&["*"], &["*.internal"], &[]);
    assert!(allowed(&any, "example.com", 1));
    assert!(!allowed(&any, "db.internal", 5432));
    let v6 = egress(&["[2001:db8::1]:443"], &[], &[]);
    assert!(allowed(&v6, "2001:db8:0::1", 443));
    assert!(!allowed(&v6, "2001:db8::1", 80));
}

#[test]
fn hosts_are_judged_in_their_canonical_form() {
    assert_eq!(
        canonical_host("DB.Internal.Example.com."),
        Ok("db.internal.example.com".to_owned())
    );
    assert_eq!(canonical_host("::ffff:1.2.3.4"), Ok("1.2.3.4".to_owned()));
    for odd in ["16909060", "0x01020304", "1.2.3", "0x7f.1", "", "."] {
        assert!(canonical_host(odd).is_err(), "{odd}");
    }
    // So a deny rule cannot be passed by another spelling of its host.
    let e = egress(&["*"], &["*.internal.example.com", "1.2.3.4"], &[]);
    let host = canonical_host("db.internal.example.com.").expect("name");
    assert!(!allowed(&e, &host, 443));
    let mapped = canonical_host("::ffff:1.2.3.4").expect("address");
    assert!(!allowed(&e, &mapped, 443));
}

#[tokio::test]
async fn a_denied_address_is_refused_however_it_was_named() {
    // A name allowed by `*` that resolves to an address a deny rule names.
    let e = egress(&["*"], &["127.0.0.1"], &[]);
    let error = e.addresses("localhost", 80).await.expect_err("denied");
    assert!(error.contains("not a public address"), "{error}");
    // The host's own addresses are refused even when public.
    for local in address::local_addresses() {
        if is_public(local) {
            let error = e
                .addresses(&local.to_string(), 80)
                .await
                .expect_err("local");
            assert!(error.contains("not a public address"), "{error}");
        }
    }
    assert!(!is_public("2002:7f00:1::1".parse().expect("6to4")));
    assert!(!is_public("2001:0:4136:e378::1".parse().expect("teredo")));
}

#[test]
fn bad_entries_are_refused_with_their_key() {
    for (allow, resolve) in [
        ("", None),
        ("exa mple.com", None),
        ("a.com:0", None),
        ("a.com:http", None),
        ("*.", None),
        ("[::1", None),
        ("a.com", Some("nowhere")),
    ] {
        let config = EgressConfig {
            allow: vec![allow.to_owned()],
            deny: Vec::new(),
            resolve: resolve
                .map(|r| BTreeMap::from([("a.com".to_owned(), r.to_owned())]))
                .unwrap_or_default(),
        };
        let error = Egress::new(&config).expect_err(allow);
        assert!(error.starts_with("egress."), "{error}");
    }
}

#[tokio::test]
async fn only_public_addresses_are_reached_unless_listed() {
    let e = egress(
        &["*", "192.168.1.10"],
        &[],
        &[("model.test", "127.0.0.1:9000")],
    );
    assert_eq!(
        e.addresses("model.test", 443).await,
        Ok(vec!["127.0.0.1:9000".parse().expect("addr")])
    );
    assert!(e.addresses("192.168.1.10", 80).await.is_ok(), "listed");
    for refused in [
        "127.0.0.1",
        "169.254.169.254",
        "10.1.2.3",
        "::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "100.64.0.1",
        "0.0.0.0",
    ] {
        let error = e.addresses(refused, 80).await.expect_err(refused);
        assert!(error.contains("not a public address"), "{error}");
    }
    let error = e.addresses("localhost", 80).await.expect_err("localhost");
    assert!(error.contains("not a public address"), "{error}");
    assert!(is_public("93.184.216.34".parse().expect("ip")));
    assert!(is_public("2606:4700::1111".parse().expect("ip")));
}

#[test]
fn a_streamed_anthropic_answer_bills_as_it_streams() {
    let mut tap = UsageTap::new(Some("text/event-stream"));
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":100,\"cache_read_input_tokens\":20,\"cache_creation_input_tokens\":5,\"output_tokens\":1}}}\n\n";
    let first = tap.feed(&start.as_bytes()[..30]);
    assert_eq!(first, None, "half a line");
    let first = tap
        .feed(&start.as_bytes()[30..])
        .expect("usage at the start");
    assert_eq!(first.input_tokens, 100);
    assert_eq!(first.total_tokens, 126);
    let delta = "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\n";
    let more = tap.feed(delta.as_bytes()).expect("the output");
    assert_eq!(
        (more.output_tokens, more.total_tokens, more.input_tokens),
        (39, 39, 0)
    );
    assert_eq!(tap.feed(b"data: {\"type\":\"ping\"}\n"), None);
    assert_eq!(tap.finish(), None);
}

#[test]
fn a_stream_cut_before_its_count_is_billed_for_what_it_streamed() {
    let mut tap = UsageTap::new(Some("text/event-stream"));
    let start = "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n";
    assert_eq!(tap.feed(start.as_bytes()).expect("input").total_tokens, 11);
    let text = "x".repeat(400);
    let delta = format!(
        "data: {{\"type\":\"content_block_delta\",\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}}}\n"
    );
    assert_eq!(tap.feed(delta.as_bytes()), None);
    // The agent hung up here: 400 bytes streamed bill about 100 tokens of output.
    let cut = tap.finish().expect("estimated");
    assert_eq!(cut.output_tokens, 99);
    // A stream that ended with its count is billed by the count alone.
    let mut tap = UsageTap::new(Some("text/event-stream"));
    tap.feed(start.as_bytes());
    tap.feed(delta.as_bytes());
    let end = "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n";
    assert_eq!(tap.feed(end.as_bytes()).expect("count").output_tokens, 6);
    assert_eq!(tap.finish(), None);
}

#[test]
fn whole_and_openai_answers_bill_too() {
    let mut tap = UsageTap::new(Some("application/json"));
    assert_eq!(tap.feed(b"{\"usage\":{\"input_tokens\":7,"), None);
    assert_eq!(tap.feed(b"\"output_tokens\":3}}"), None);
    assert_eq!(tap.finish().expect("usage").total_tokens, 10);
    let mut tap = UsageTap::new(Some("text/event-stream; charset=utf-8"));
    let done = "data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":50,\"input_tokens_details\":{\"cached_tokens\":30},\"output_tokens\":9,\"total_tokens\":59}}}\n";
    let usage = tap.feed(done.as_bytes()).expect("usage");
    assert_eq!((usage.total_tokens, usage.cache_read_tokens), (59, 30));
    let mut tap = UsageTap::new(Some("text/event-stream"));
    let chunk = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2,\"total_tokens\":6}}\ndata: [DONE]\n";
    assert_eq!(tap.feed(chunk.as_bytes()).expect("usage").total_tokens, 6);
}
