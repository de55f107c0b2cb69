//! Server-sent events framing: `id: <id>\ndata: <compact JSON>\n\n`, LF only.
//!
//! The official clients split on `\n\n` and read `data:` lines; compact JSON never contains a
//! raw newline (serde_json escapes them), so one event is always one `data:` line.

use std::cell::RefCell;

use bytes::Bytes;

use super::events::Event;

/// The comment sent after a period of silence so proxies keep the stream open.
pub const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// A scratch buffer kept larger than this is released after use.
const SCRATCH_KEEP: usize = 256 * 1024;

thread_local! {
    /// Per-thread scratch for encoding, so a frame is encoded without growing a buffer and
    /// then copied once into a buffer of exactly its size.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Compact JSON of one event, with `timestamp` (integer milliseconds) when given.
pub fn encode_event(event: &Event, timestamp_ms: Option<u64>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, event, timestamp_ms);
    out
}

/// Appends the compact JSON of `event` to `out`, `timestamp` last.
fn encode_into(out: &mut Vec<u8>, event: &Event, timestamp_ms: Option<u64>) {
    let start = out.len();
    // Serializing these types cannot fail: every map key is a string and no value is a
    // non-finite float (serde_json::Value cannot hold one).
    if serde_json::to_writer(&mut *out, event).is_err() {
        out.truncate(start);
        out.extend_from_slice(b"{}");
        return;
    }
    // Every event is a JSON object with at least its `type`: the timestamp goes in before
    // the closing brace.
    if let Some(ms) = timestamp_ms
        && out.last() == Some(&b'}')
    {
        out.pop();
        out.extend_from_slice(b",\"timestamp\":");
        out.extend_from_slice(itoa::Buffer::new().format(ms).as_bytes());
        out.push(b'}');
    }
}

/// The SSE frame of `event` under event id `id`, in a buffer of exactly its size.
pub fn event_frame(id: &str, event: &Event, timestamp_ms: Option<u64>) -> Bytes {
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        scratch.clear();
        frame_into(&mut scratch, id, event, timestamp_ms);
        let frame = Bytes::copy_from_slice(&scratch);
        if scratch.capacity() > SCRATCH_KEEP {
            *scratch = Vec::new();
        }
        frame
    })
}

/// Appends the SSE frame of `event` under event id `id` to `out` (the bytes of
/// [`event_frame`], written where a caller gathers several frames in one buffer).
pub fn frame_into(out: &mut Vec<u8>, id: &str, event: &Event, timestamp_ms: Option<u64>) {
    put_frame(out, id, |out| encode_into(out, event, timestamp_ms));
}

/// One SSE frame carrying `data` (already-encoded JSON) under event id `id`.
pub fn sse_frame(id: &str, data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(id.len() + data.len() + FRAMING);
    put_frame(&mut out, id, |out| out.extend_from_slice(data));
    Bytes::from(out)
}

/// The one place the framing is written: `id: <id>\ndata: `, what `data` appends, `\n\n`.
fn put_frame(out: &mut Vec<u8>, id: &str, data: impl FnOnce(&mut Vec<u8>)) {
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    data(out);
    out.extend_from_slice(b"\n\n");
}

/// Bytes of framing around the id and the data: `id: `, `\ndata: `, `\n\n`.
const FRAMING: usize = 4 + 7 + 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_exactly_sized_and_carry_the_timestamp_last() {
        let event = Event::TextMessageContent {
            message_id: "m".into(),
            delta: "a\nb".into(),
            subagent_run_id: None,
        };
        let frame = event_frame("1-2-3", &event, Some(17));
        assert_eq!(
            &frame[..],
            &b"id: 1-2-3\ndata: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":\"m\",\"delta\":\"a\\nb\",\"timestamp\":17}\n\n"[..]
        );
        assert_eq!(frame, sse_frame("1-2-3", &encode_event(&event, Some(17))));
        let untimed = encode_event(&event, None);
        assert!(untimed.ends_with(b"\"delta\":\"a\\nb\"}"));
    }
}
