//! `Accept` negotiation for the event stream.
//!
//! We serve `text/event-stream`. A missing header, `text/event-stream`, `text/*` or `*/*`
//! with a non-zero quality selects it. The protobuf framing
//! (`application/vnd.ag-ui.event+proto`) is not served; a request that accepts only it, or
//! only other types (`application/xml`, `*/*;q=0`), is not acceptable.

/// The representation chosen for a response stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Negotiated {
    EventStream,
}

/// Picks the stream representation for an `Accept` header value, or `None` (406).
pub fn negotiate(accept: Option<&str>) -> Option<Negotiated> {
    let Some(accept) = accept else {
        return Some(Negotiated::EventStream);
    };
    if accept.trim().is_empty() {
        return Some(Negotiated::EventStream);
    }
    // The most specific matching range decides the quality (RFC 9110 §12.5.1).
    let mut best: Option<(u8, f32)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let specificity = match media.as_str() {
            "text/event-stream" => 3,
            "text/*" => 2,
            "*/*" => 1,
            _ => continue,
        };
        let mut q = 1.0f32;
        for param in parts {
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
        if best.is_none_or(|(s, _)| specificity > s) {
            best = Some((specificity, q));
        }
    }
    match best {
        Some((_, q)) if q > 0.0 => Some(Negotiated::EventStream),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(negotiate(ok), Some(Negotiated::EventStream), "{ok:?}");
        }
    }

    #[test]
    fn excluded_event_stream_is_not_acceptable() {
        for bad in [
            Some("*/*;q=0"),
            Some("application/xml"),
            Some("application/vnd.ag-ui.event+proto"),
            Some("text/event-stream;q=0"),
            Some("text/event-stream;q=0, */*"),
            Some("text/html"),
        ] {
            assert_eq!(negotiate(bad), None, "{bad:?}");
        }
    }
}
