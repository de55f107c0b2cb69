//! Server-sent events framing: `id: <id>\ndata: <compact JSON>\n\n`, LF only.
//!
//! The official clients split on `\n\n` and read `data:` lines; compact JSON never contains a
//! raw newline (serde_json escapes them), so one event is always one `data:` line.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

use super::events::Event;

/// The comment sent after a period of silence so proxies keep the stream open.
pub const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

#[derive(Serialize)]
struct Stamped<'a> {
    #[serde(flatten)]
    event: &'a Event,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<u64>,
}

/// Compact JSON of one event, with `timestamp` (integer milliseconds) when given.
pub fn encode_event(event: &Event, timestamp_ms: Option<u64>) -> Vec<u8> {
    let stamped = Stamped {
        event,
        timestamp: timestamp_ms,
    };
    // Serializing these types cannot fail: every map key is a string and no value is a
    // non-finite float (serde_json::Value cannot hold one).
    serde_json::to_vec(&stamped).unwrap_or_else(|_| b"{}".to_vec())
}

/// One SSE frame carrying `data` (already-encoded JSON) under event id `id`.
pub fn sse_frame(id: &str, data: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(id.len() + data.len() + 12);
    buf.put_slice(b"id: ");
    buf.put_slice(id.as_bytes());
    buf.put_slice(b"\ndata: ");
    buf.put_slice(data);
    buf.put_slice(b"\n\n");
    buf.freeze()
}
