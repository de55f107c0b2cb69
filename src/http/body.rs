//! Response bodies: small JSON documents, and the event stream read from an attachment.
//!
//! An event stream is the attachment itself, polled by hyper whenever it can take more: no
//! task and no channel in between. A dropped body detaches at once; a body that takes
//! nothing for the stall timeout is cut by the runtime's stall check (the client can
//! reattach with its last id). Either way the run goes on.

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

/// The SSE body of `attachment`: each frame (or keep-alive comment) becomes one data frame,
/// written as soon as hyper can take it.
pub fn event_stream(attachment: Attachment) -> Body {
    let stream = futures_util::stream::unfold(attachment, |mut attachment| async move {
        let bytes = attachment.next().await?;
        Some((Ok::<_, Infallible>(Frame::data(bytes)), attachment))
    });
    StreamBody::new(stream).boxed_unsync()
}
