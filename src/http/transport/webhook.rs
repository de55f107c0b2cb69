//! The webhooks' HTTP client: hyper-util's pooled client over plain HTTP, or HTTPS with
//! the rustls the daemon serves with, verified against the system's root certificates
//! (`SSL_CERT_FILE` / `SSL_CERT_DIR` override them). It implements
//! [`crate::webhooks::Post`], lent to the delivery by the server. An attempt is bounded as
//! a whole (connect, request, response head); the answer's body is drained, not kept.
//! Errors name what failed, never the URL (its path may be a secret).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::webhooks::{Post, PostError, PostFuture};

/// How long connecting may take, within an attempt's timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an answer's body is drained after its head, at most.
const DRAIN_TIME: Duration = Duration::from_secs(10);
/// The most of an answer's body read (and dropped) so its connection can be reused.
const DRAIN_LIMIT: usize = 64 * 1024;

/// POSTs webhook events.
#[derive(Debug, Clone)]
pub struct WebhookClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl WebhookClient {
    /// A client on the current tokio runtime. Without any system root certificate only
    /// plain HTTP endpoints can be reached (an `https` one then fails its handshake, and
    /// is retried like any failure).
    pub fn new() -> std::io::Result<WebhookClient> {
        let connector = super::system_roots_connector(CONNECT_TIMEOUT, "webhooks")?;
        Ok(WebhookClient {
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    async fn send(
        &self,
        url: &http::Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<u16, PostError> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(url.clone())
            .body(Full::new(body))
            .map_err(|e| PostError::Failed(format!("bad request: {e}")))?;
        *request.headers_mut() = headers;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| PostError::Failed(describe(&e)))?;
        let status = response.status().as_u16();
        // The head is the delivery. The body is drained afterwards, apart from the
        // attempt (up to a bound in size and time), so the connection can go back to the
        // pool; a slow one is dropped, never a reason to deliver again.
        let mut body = response.into_body();
        tokio::spawn(async move {
            let drain = async {
                let mut read = 0;
                while read < DRAIN_LIMIT {
                    match body.frame().await {
                        Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                        _ => break,
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
        });
        Ok(status)
    }
}

impl Post for WebhookClient {
    fn post<'a>(
        &'a self,
        url: &'a http::Uri,
        headers: HeaderMap,
        body: Bytes,
        timeout: Duration,
    ) -> PostFuture<'a> {
        Box::pin(async move {
            tokio::time::timeout(timeout, self.send(url, headers, body))
                .await
                .map_err(|_| PostError::Timeout(timeout))?
        })
    }
}

/// A client error and its causes, one line, without the URL.
fn describe(error: &hyper_util::client::legacy::Error) -> String {
    use std::error::Error;
    let mut text = if error.is_connect() {
        "cannot connect".to_owned()
    } else {
        "request failed".to_owned()
    };
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
