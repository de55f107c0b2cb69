//! Response bodies: small JSON documents, and the event stream read from an attachment.

use std::convert::Infallible;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};

use tokio::sync::mpsc;

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

/// The SSE body: each frame (or keep-alive comment) the stream's writer task hands over
/// becomes one data frame, written as soon as hyper can take it. Dropping the body (client
/// gone) detaches the stream; the run goes on.
pub fn event_stream(frames: mpsc::Receiver<Bytes>) -> Body {
    let stream = futures_util::stream::unfold(frames, |mut frames| async move {
        let bytes = frames.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(bytes)), frames))
    });
    StreamBody::new(stream).boxed_unsync()
}
