//! Bodies: reading a request body within its limit, and the response bodies (small JSON
//! documents, and the event stream read from an attachment).
//!
//! An event stream is two halves: a writer task that reads the [`Attachment`] and hands
//! frames to a small channel, and the response body that drains the channel. A body that
//! takes nothing for the stall timeout is cut (the client can reattach with its last id); a
//! dropped body detaches at once. Either way the run goes on.

use std::convert::Infallible;

use bytes::Bytes;
use http::HeaderMap;
use http::header::CONTENT_LENGTH;
use http_body::Frame;
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::Incoming;

use std::time::Duration;

use tokio::sync::mpsc::{self, error::SendTimeoutError};

use super::error::ApiError;
use crate::runtime::Attachment;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Frames buffered between a stream's writer task and its response body.
const STREAM_BUFFER: usize = 16;

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

/// Reads a request body up to `limit` bytes within `timeout`; a declared or actual excess
/// is 413 without reading further, a body still incomplete at the timeout is 408.
pub async fn read_body(
    body: Incoming,
    headers: &HeaderMap,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::payload_too_large(limit));
    }
    let collected = match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Ok(collected) => collected,
        Err(_) => return Err(ApiError::request_timeout(timeout)),
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) => {
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(ApiError::payload_too_large(limit))
            } else {
                Err(ApiError::invalid_request(
                    "the request body could not be read",
                ))
            }
        }
    }
}

/// The SSE body of `attachment`: each frame (or keep-alive comment) becomes one data frame,
/// written as soon as hyper can take it. A body that takes nothing for `stall` is cut.
pub fn event_stream(attachment: Attachment, stall: Duration) -> Body {
    let frames = spawn_writer(attachment, stall);
    let stream = futures_util::stream::unfold(frames, |mut frames| async move {
        let bytes = frames.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(bytes)), frames))
    });
    StreamBody::new(stream).boxed_unsync()
}

/// Moves `attachment` into its own task feeding a bounded channel; the receiver is the
/// response body.
fn spawn_writer(mut attachment: Attachment, stall: Duration) -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(async move {
        loop {
            let bytes = tokio::select! {
                next = attachment.next() => match next {
                    Some(bytes) => bytes,
                    None => break,
                },
                () = tx.closed() => break,
            };
            match tx.send_timeout(bytes, stall).await {
                Ok(()) => {}
                Err(SendTimeoutError::Timeout(_)) => {
                    tracing::warn!(
                        thread.id = %attachment.thread_id(),
                        stall_ms = stall.as_millis() as u64,
                        "stream stopped draining; cut so it can reattach"
                    );
                    break;
                }
                Err(SendTimeoutError::Closed(_)) => break,
            }
        }
    });
    rx
}
