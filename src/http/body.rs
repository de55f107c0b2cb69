//! Response bodies: small JSON documents, and the event stream read from an attachment.

use std::convert::Infallible;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};

use crate::runtime::Attachment;

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

/// The SSE body: each journal frame (or keep-alive comment) becomes one data frame, written
/// as soon as hyper can take it. Dropping the body (client gone) detaches the stream; the
/// run goes on.
pub fn event_stream(attachment: Attachment) -> Body {
    let stream = futures_util::stream::unfold(attachment, |mut attachment| async move {
        let bytes = attachment.next().await?;
        Some((Ok::<_, Infallible>(Frame::data(bytes)), attachment))
    });
    StreamBody::new(stream).boxed_unsync()
}
