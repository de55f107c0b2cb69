//! Bodies: reading a request body within its limit, and the response bodies (small JSON
//! documents, and the event stream read from an attachment).
//!
//! An event stream is the attachment itself, polled by hyper whenever it can take more: no
//! task and no channel in between. A dropped body detaches at once; a body that takes
//! nothing for the stall timeout is cut by the runtime's stall check (the client can
//! reattach with its last id). Either way the run goes on.

use std::convert::Infallible;

use bytes::Bytes;
use http::HeaderMap;
use http::header::CONTENT_LENGTH;
use http_body::Frame;
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::Incoming;

use std::time::Duration;

use crate::runtime::Attachment;

/// Largest request head (request line and headers) accepted, in all: over it, 431
/// `HEADERS_TOO_LARGE` (HTTP/2: the header list, answered 431 by the HTTP/2 layer).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Longest request target (path and query) accepted: over it, 414 `URI_TOO_LONG`.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Most header fields in an HTTP/1.1 request: over it, 431 `HEADERS_TOO_LARGE`.
pub const MAX_HEADER_FIELDS: usize = 100;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// A request body as the routes read it: as it arrives, or already read (a cluster node
/// reads a forwardable request whole first, so that it can still send it to the thread's
/// owner).
pub type RequestBody = http_body_util::Either<Draining, Full<Bytes>>;

/// Most bytes of a body dropped unread that are read on, in the background, to its end.
const DRAIN_BYTES: usize = 1024 * 1024;
/// Longest such a body is read on.
const DRAIN_TIME: Duration = Duration::from_secs(5);
/// Most bodies read on at once, over every connection; past it a body is dropped as it is.
const DRAINS: usize = 256;

/// The bodies being read on now.
static DRAINING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A request body as it arrives which, dropped without a read (a refusal answered before
/// the body: no token, a wrong origin, no such route), is read on to its end in the
/// background, up to [`DRAIN_BYTES`] and [`DRAIN_TIME`], at most [`DRAINS`] at once. (A
/// body given up part way, one declared larger than that, or one that waits for `100
/// Continue` is dropped as it is.) Dropped unread, an HTTP/2
/// request's stream is reset while the client may still be sending, and a client (curl)
/// then reports a framing error instead of the answer it was given; an HTTP/1.1
/// connection can be kept for the next request.
#[derive(Debug)]
pub struct Draining {
    inner: Option<Incoming>,
    read: bool,
    expects_continue: bool,
}

impl Draining {
    /// `req` with its body read on to its end when it is dropped unread (an answer given
    /// before the body).
    pub fn request(req: http::Request<Incoming>) -> http::Request<Draining> {
        let (parts, body) = req.into_parts();
        let body = Draining::new(body, &parts.headers);
        http::Request::from_parts(parts, body)
    }

    /// `inner`, of a request whose headers are `headers`.
    pub fn new(inner: Incoming, headers: &HeaderMap) -> Draining {
        let expects_continue = headers
            .get(http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        Draining {
            inner: Some(inner),
            read: false,
            expects_continue,
        }
    }
}

impl http_body::Body for Draining {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        self.read = true;
        match self.inner.as_mut() {
            Some(inner) => std::pin::Pin::new(inner).poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.as_ref().map_or_else(
            || http_body::SizeHint::with_exact(0),
            http_body::Body::size_hint,
        )
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        // Nothing to gain when the body was read, is over, cannot fit, or will not come
        // (a client that waits for `100 Continue` never sends it after a final answer).
        let too_large = http_body::Body::size_hint(&inner)
            .upper()
            .is_some_and(|n| n > DRAIN_BYTES as u64);
        if self.read || self.expects_continue || too_large || http_body::Body::is_end_stream(&inner)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(held) = DrainSlot::take() else {
            return;
        };
        runtime.spawn(async move {
            // Given back however the task ends (dropped unrun at shutdown too).
            let _held = held;
            let mut left = DRAIN_BYTES;
            let mut body = inner;
            let read_on = async {
                while let Some(Ok(frame)) = body.frame().await {
                    let len = frame.data_ref().map_or(0, Bytes::len);
                    let Some(rest) = left.checked_sub(len) else {
                        return;
                    };
                    left = rest;
                }
            };
            // Over either bound, the body is dropped: the stream is reset after all.
            let _ = tokio::time::timeout(DRAIN_TIME, read_on).await;
        });
    }
}

/// One of the [`DRAINS`] bodies read on at once, given back when dropped.
struct DrainSlot;

impl DrainSlot {
    fn take() -> Option<DrainSlot> {
        let held = DRAINING.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if held >= DRAINS {
            DRAINING.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        }
        Some(DrainSlot)
    }
}

impl Drop for DrainSlot {
    fn drop(&mut self) {
        DRAINING.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Every response body this server sends.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A complete body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

/// An empty body.
pub fn empty() -> Body {
    full(Bytes::new())
}

/// Why a request body could not be read (`error.rs` picks the status: 413, 408, 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Declared or found longer than this many bytes.
    TooLarge(usize),
    /// Still incomplete after this long.
    Timeout(Duration),
    /// The connection failed while the body was read.
    Unreadable,
}

/// Reads a request body up to `limit` bytes within `timeout`; a declared or actual excess
/// is refused without reading further.
pub async fn read_body<B>(
    body: B,
    headers: &HeaderMap,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, BodyError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(BodyError::TooLarge(limit));
    }
    let collected = match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Ok(collected) => collected,
        Err(_) => return Err(BodyError::Timeout(timeout)),
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) => {
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(BodyError::TooLarge(limit))
            } else {
                Err(BodyError::Unreadable)
            }
        }
    }
}

/// The SSE body of `attachment`: each frame (or keep-alive comment), with the frames
/// already journaled after it, becomes one data frame, written as soon as hyper can take it.
pub fn event_stream(attachment: Attachment) -> Body {
    let stream = futures_util::stream::unfold(attachment, |mut attachment| async move {
        let bytes = attachment.next_chunk().await?;
        Some((Ok::<_, Infallible>(Frame::data(bytes)), attachment))
    });
    StreamBody::new(stream).boxed_unsync()
}

/// The protobuf body of `attachment`: the same chunks as [`event_stream`], each re-encoded
/// as protobuf frames (`protocol::proto`). A chunk with no event in it (a keep-alive
/// comment: the encoding has none) sends nothing.
pub fn protobuf_stream(attachment: Attachment) -> Body {
    let stream = futures_util::stream::unfold(attachment, |mut attachment| async move {
        loop {
            let sse = attachment.next_chunk().await?;
            let frames = crate::protocol::proto::transcode(&sse);
            if !frames.is_empty() {
                return Some((Ok::<_, Infallible>(Frame::data(frames)), attachment));
            }
        }
    });
    StreamBody::new(stream).boxed_unsync()
}

/// The SSE body of a fleet subscription: each event as a frame with its id and timestamp,
/// keep-alive comments in silences.
pub fn fleet_stream(stream: crate::runtime::FleetStream) -> Body {
    use crate::runtime::FleetItem;
    let stream = futures_util::stream::unfold(stream, |mut stream| async move {
        let bytes = match stream.next().await? {
            FleetItem::Frame(frame) => frame,
            FleetItem::KeepAlive => Bytes::from_static(crate::protocol::KEEP_ALIVE),
        };
        Some((Ok::<_, Infallible>(Frame::data(bytes)), stream))
    });
    StreamBody::new(stream).boxed_unsync()
}

/// Bytes read from `file` as they are sent, 64 KiB at a time: a file is never held whole.
/// A read error ends the body early (with its `Content-Length` set, the client sees it cut).
pub fn file_body(file: tokio::fs::File) -> Body {
    let stream = futures_util::stream::unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt as _;
        let mut buffer = bytes::BytesMut::with_capacity(64 * 1024);
        match file.read_buf(&mut buffer).await {
            Ok(0) | Err(_) => None,
            Ok(_) => Some((Ok::<_, Infallible>(Frame::data(buffer.freeze())), file)),
        }
    });
    StreamBody::new(stream).boxed_unsync()
}
