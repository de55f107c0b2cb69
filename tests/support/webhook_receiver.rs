//! A webhook receiver for tests: a hyper server on a loopback port that checks every POST's
//! `agui-signature` with the endpoint's secret (the daemon's own `verify`, and again with
//! `ring`'s HMAC, an implementation that shares nothing with the daemon's), records every
//! attempt, and answers as told: 200, 500, or 200 after a delay.
#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Ok,
    /// 500: the event must be retried.
    Fail,
    /// 200 after this long.
    Slow(Duration),
    /// 200 at once, its body's last byte after this long.
    SlowBody(Duration),
}

/// One POST as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `agui-event-id`.
    pub id: String,
    pub body: Value,
    pub raw: Bytes,
    pub signature: String,
    /// The signature checked out (both ways).
    pub verified: bool,
    /// Answered 200.
    pub accepted: bool,
}

impl Received {
    pub fn kind(&self) -> &str {
        self.body["type"].as_str().unwrap_or("")
    }

    pub fn thread(&self) -> &str {
        self.body["threadId"].as_str().unwrap_or("")
    }
}

struct State {
    answer: Answer,
    received: Vec<Received>,
}

/// The receiver; it runs until the test ends.
#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    pub secret: Vec<u8>,
    state: Arc<Mutex<State>>,
}

/// Checks `signature` (`t=..,v1=..`) over `body` with `ring`'s HMAC-SHA256.
pub fn verify_independently(secret: &[u8], signature: &str, body: &[u8]) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in signature.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => t = Some(value.to_owned()),
            Some(("v1", value)) => v1 = Some(value.to_owned()),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    let Some(code) = decode_hex(&v1) else {
        return false;
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let mut message = t.into_bytes();
    message.push(b'.');
    message.extend_from_slice(body);
    ring::hmac::verify(&key, &message, &code).is_ok()
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Receiver {
    /// A receiver on a fresh loopback port checking signatures with `secret`.
    pub async fn start(secret: &[u8], answer: Answer) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the receiver");
        let url = format!(
            "http://{}/hooks/s3cret-path",
            listener.local_addr().expect("addr")
        );
        let state = Arc::new(Mutex::new(State {
            answer,
            received: Vec::new(),
        }));
        let receiver = Receiver {
            url,
            secret: secret.to_vec(),
            state,
        };
        let serving = receiver.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let serving = serving.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let serving = serving.clone();
                        async move { Ok::<_, Infallible>(serving.handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        receiver
    }

    async fn handle(
        &self,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<BoxBody<Bytes, Infallible>> {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let id = header("agui-event-id");
        let signature = header("agui-signature");
        let raw = match req.into_body().collect().await {
            Ok(body) => body.to_bytes(),
            Err(_) => Bytes::new(),
        };
        let verified =
            agui_serve::webhooks::sign::verify(&self.secret, &signature, &raw, now_s(), 300)
                .is_ok()
                && verify_independently(&self.secret, &signature, &raw);
        let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
        let answer = self.state.lock().expect("lock").answer;
        if let Answer::Slow(delay) = answer {
            tokio::time::sleep(delay).await;
        }
        let accepted = verified && answer != Answer::Fail;
        self.state.lock().expect("lock").received.push(Received {
            id,
            body,
            raw,
            signature,
            verified,
            accepted,
        });
        let status = if !verified {
            401
        } else if accepted {
            200
        } else {
            500
        };
        let body = match answer {
            Answer::SlowBody(delay) if status == 200 => {
                let chunks = futures_util::stream::unfold(0u8, move |step| async move {
                    match step {
                        0 => Some((Ok(hyper::body::Frame::data(Bytes::from_static(b"{"))), 1)),
                        1 => {
                            tokio::time::sleep(delay).await;
                            Some((Ok(hyper::body::Frame::data(Bytes::from_static(b"}"))), 2))
                        }
                        _ => None,
                    }
                });
                StreamBody::new(chunks).boxed()
            }
            _ => Full::new(Bytes::from_static(b"{}")).boxed(),
        };
        hyper::Response::builder()
            .status(status)
            .body(body)
            .expect("response")
    }

    /// From now on, answer so.
    pub fn answer(&self, answer: Answer) {
        self.state.lock().expect("lock").answer = answer;
    }

    /// Every attempt so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.state.lock().expect("lock").received.clone()
    }

    /// The accepted attempts, in arrival order.
    pub fn accepted(&self) -> Vec<Received> {
        self.received().into_iter().filter(|r| r.accepted).collect()
    }

    /// Waits (up to `within`) until `done` holds for the attempts so far.
    pub async fn wait_until(
        &self,
        what: &str,
        within: Duration,
        mut done: impl FnMut(&[Received]) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if done(&self.received()) {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                let seen: Vec<String> = self
                    .received()
                    .iter()
                    .map(|r| {
                        format!(
                            "{} {} {} accepted={}",
                            r.thread(),
                            r.kind(),
                            r.id,
                            r.accepted
                        )
                    })
                    .collect();
                panic!(
                    "timed out waiting for {what}; received:\n{}",
                    seen.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
