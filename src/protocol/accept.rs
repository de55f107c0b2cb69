//! `Accept` negotiation for the event stream.
//!
//! SSE (`text/event-stream`) is the default: a missing header, `text/event-stream`, `text/*`
//! or `*/*` with a non-zero quality selects it. The protobuf encoding
//! (`application/vnd.ag-ui.event+proto`) is chosen only where the route offers it and the
//! header names it explicitly (wildcards never select it) with a quality above SSE's. A
//! request that accepts none of what the route offers (`application/xml`, `*/*;q=0`) is not
//! acceptable.

use super::proto::MEDIA_TYPE as PROTOBUF;

/// The representation chosen for a response stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Negotiated {
    EventStream,
    Protobuf,
}

/// What a route can answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// SSE only.
    EventStream,
    /// SSE, or protobuf when asked for by name.
    EventStreamOrProtobuf,
}

/// Picks the stream representation for an `Accept` header value among what `offer` allows,
/// or `None` (406).
pub fn negotiate(accept: Option<&str>, offer: Offer) -> Option<Negotiated> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Negotiated::EventStream);
    };
    // The most specific matching range decides the quality (RFC 9110 §12.5.1).
    let mut sse: Option<(u8, f32)> = None;
    let mut protobuf: Option<f32> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = quality(parts);
        let specificity = match media.as_str() {
            "text/event-stream" => 3,
            "text/*" => 2,
            "*/*" => 1,
            PROTOBUF => {
                protobuf = Some(q);
                continue;
            }
            _ => continue,
        };
        if sse.is_none_or(|(s, _)| specificity > s) {
            sse = Some((specificity, q));
        }
    }
    let sse = sse.map_or(0.0, |(_, q)| q);
    let protobuf = match offer {
        Offer::EventStreamOrProtobuf => protobuf.unwrap_or(0.0),
        Offer::EventStream => 0.0,
    };
    if protobuf > 0.0 && protobuf > sse {
        Some(Negotiated::Protobuf)
    } else if sse > 0.0 {
        Some(Negotiated::EventStream)
    } else {
        None
    }
}

/// The `q` parameter among a range's parameters (1 when absent, 0 when malformed).
fn quality<'a>(params: impl Iterator<Item = &'a str>) -> f32 {
    let mut q = 1.0f32;
    for param in params {
        let mut kv = param.splitn(2, '=');
        let key = kv.next().unwrap_or("").trim();
        if key.eq_ignore_ascii_case("q") {
            q = kv
                .next()
                .and_then(|v| v.trim().parse::<f32>().ok())
                .filter(|v| (0.0..=1.0).contains(v))
                .unwrap_or(0.0);
        }
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: Offer = Offer::EventStreamOrProtobuf;

    #[test]
    fn event_stream_is_chosen_when_acceptable() {
        for ok in [
            None,
            Some(""),
            Some("text/event-stream"),
            Some("*/*"),
            Some("text/*"),
            Some("application/json, text/event-stream;q=0.5"),
            Some("TEXT/EVENT-STREAM"),
            Some("*/*;q=0, text/event-stream"),
        ] {
            assert_eq!(
                negotiate(ok, Offer::EventStream),
                Some(Negotiated::EventStream),
                "{ok:?}"
            );
            assert_eq!(negotiate(ok, BOTH), Some(Negotiated::EventStream), "{ok:?}");
        }
    }

    #[test]
    fn excluded_event_stream_is_not_acceptable() {
        for bad in [
            Some("*/*;q=0"),
            Some("application/xml"),
            Some("text/event-stream;q=0"),
            Some("text/event-stream;q=0, */*"),
            Some("text/html"),
            Some("application/vnd.ag-ui.event+proto;q=0"),
            Some("application/*"),
        ] {
            assert_eq!(negotiate(bad, Offer::EventStream), None, "{bad:?}");
            assert_eq!(negotiate(bad, BOTH), None, "{bad:?}");
        }
    }

    #[test]
    fn protobuf_is_chosen_only_by_name_and_where_offered() {
        for proto in [
            "application/vnd.ag-ui.event+proto",
            "Application/Vnd.AG-UI.Event+Proto",
            "application/vnd.ag-ui.event+proto, text/event-stream;q=0.5",
            "text/event-stream;q=0.9, application/vnd.ag-ui.event+proto",
            "application/vnd.ag-ui.event+proto;q=0.8, */*;q=0.1",
        ] {
            assert_eq!(
                negotiate(Some(proto), BOTH),
                Some(Negotiated::Protobuf),
                "{proto:?}"
            );
        }
        // Only protobuf, where only SSE is offered: nothing acceptable.
        assert_eq!(
            negotiate(
                Some("application/vnd.ag-ui.event+proto"),
                Offer::EventStream
            ),
            None
        );
        // A tie, or SSE preferred: SSE, the default.
        for sse in [
            "application/vnd.ag-ui.event+proto, text/event-stream",
            "application/vnd.ag-ui.event+proto, */*",
            "application/vnd.ag-ui.event+proto;q=0.5, text/event-stream",
            "application/vnd.ag-ui.event+proto;q=0, */*",
        ] {
            assert_eq!(
                negotiate(Some(sse), BOTH),
                Some(Negotiated::EventStream),
                "{sse:?}"
            );
            assert_eq!(
                negotiate(Some(sse), Offer::EventStream),
                Some(Negotiated::EventStream),
                "{sse:?}"
            );
        }
    }
}
