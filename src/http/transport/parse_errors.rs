//! Our JSON error for the HTTP/1.1 requests hyper refuses before our router sees them.
//!
//! hyper answers a request it cannot parse (a bad request line, a malformed or forbidden
//! header: conflicting `Content-Length`, obs-fold, NUL or other control bytes in a value;
//! a URI over its limit; headers over `max_buf_size`) with a bare `400`, `414` or `431`
//! and closes the connection; there is no hook to choose that response. [`JsonErrors`]
//! wraps a connection's I/O and recognises that response as hyper writes it (a complete
//! head, first in its write, one of those statuses, no `content-type`, an empty body:
//! every response of ours with those statuses carries a JSON body), and writes the
//! [`ApiError`] for the status in its place. Everything else passes through untouched,
//! including every HTTP/2 connection (whose frames never start with `HTTP/1.`).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http::error::ApiError;

/// A connection's I/O with hyper's bare parse-error responses replaced by JSON ones.
pub(super) struct JsonErrors<IO> {
    io: IO,
    /// A replacement being written, and how many bytes of hyper's head it stands for.
    replacing: Option<(Bytes, usize)>,
}

impl<IO> JsonErrors<IO> {
    pub(super) fn new(io: IO) -> JsonErrors<IO> {
        JsonErrors {
            io,
            replacing: None,
        }
    }
}

impl<IO: AsyncWrite + Unpin> JsonErrors<IO> {
    /// Writes what is left of a replacement; ready with the length of the head it replaced.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<usize>>> {
        let Some((rest, _)) = &mut self.replacing else {
            return Poll::Ready(Ok(None));
        };
        while rest.has_remaining() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, rest.chunk()))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            rest.advance(n);
        }
        let replaced = self.replacing.take().map(|(_, len)| len);
        Poll::Ready(Ok(replaced))
    }

    /// Starts replacing `buf`'s head if it is one of hyper's bare parse-error responses.
    fn recognise(&mut self, buf: &[u8]) -> bool {
        match bare_error_head(buf) {
            Some((status, head_len)) => {
                tracing::debug!(
                    status = status.as_u16(),
                    "request refused by the HTTP/1.1 parser"
                );
                self.replacing = Some((json_response(status), head_len));
                true
            }
            None => false,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for JsonErrors<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for JsonErrors<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.replacing.is_some() || this.recognise(buf) {
            let replaced = ready!(this.drive(cx))?;
            return Poll::Ready(Ok(replaced.unwrap_or(0)));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let first = bufs.iter().find(|b| !b.is_empty());
        if this.replacing.is_some() || first.is_some_and(|b| this.recognise(b)) {
            let replaced = ready!(this.drive(cx))?;
            return Poll::Ready(Ok(replaced.unwrap_or(0)));
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drive(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drive(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The status and head length of `buf` when it starts with a complete response head that
/// hyper wrote for a parse error: 400, 414 or 431, no `content-type`, no body.
fn bare_error_head(buf: &[u8]) -> Option<(StatusCode, usize)> {
    if !buf.starts_with(b"HTTP/1.") {
        return None;
    }
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head_len) = response.parse(buf).ok()? else {
        return None;
    };
    let status = StatusCode::from_u16(response.code?).ok()?;
    if !matches!(
        status,
        StatusCode::BAD_REQUEST
            | StatusCode::URI_TOO_LONG
            | StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    ) {
        return None;
    }
    let bodiless = response.headers.iter().all(|h| {
        !h.name.eq_ignore_ascii_case("content-type")
            && (!h.name.eq_ignore_ascii_case("content-length") || h.value == b"0")
            && !h.name.eq_ignore_ascii_case("transfer-encoding")
    });
    bodiless.then_some((status, head_len))
}

/// The whole HTTP/1.1 response for a parse error: our JSON body, and `connection: close`
/// (hyper closes the connection after it).
fn json_response(status: StatusCode) -> Bytes {
    let error = ApiError::unparsable_request(status);
    let body = error.body();
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&body);
    Bytes::from(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bare_heads_of_parse_error_statuses_are_recognised() {
        let bare = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        assert_eq!(
            bare_error_head(bare),
            Some((StatusCode::BAD_REQUEST, bare.len()))
        );
        let large = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n\r\n";
        assert!(bare_error_head(large).is_some());
        for other in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
            b"HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n",
            b"1a\r\nHTTP/1.1 400 Bad Request\r\n\r\n",
            b"\x00\x00\x12\x04\x00\x00\x00\x00\x00",
        ] {
            assert_eq!(bare_error_head(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn the_replacement_is_our_json_error() {
        let bytes = json_response(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        let text = String::from_utf8_lossy(&bytes);
        let (head, body) = text.split_once("\r\n\r\n").expect("head");
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(body["code"], "HEADERS_TOO_LARGE");
    }
}
