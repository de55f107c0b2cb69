//! The delivery: one task per endpoint, and one that prunes delivered rows.
//!
//! An endpoint's task claims the due heads of its threads (each thread's oldest
//! undelivered event, [`Store::claim_outgoing`]), POSTs them at once (different threads),
//! and records how each went ([`Store::record_attempts`]), then claims again (after
//! [`GATHER`] unless the pass was full, so that one claim serves many runs' events). A failed
//! attempt (no answer within the timeout, or an answer that is not 2xx) is retried after
//! [`backoff`]: 1s, doubling, capped at the endpoint's `max_backoff`; the thread's later
//! events wait behind it, other threads' do not. With nothing due, the task waits for an
//! event queued on this node ([`super::Outbox::queued`]), the earliest retry it knows of,
//! or [`POLL`] (another node's events, another node's failures), whichever comes first.
//!
//! Every attempt of an event carries the same `agui-event-id`, on every node and after a
//! restart (it is the row's id): a receiver that gets an event twice (an answer lost, a
//! claim that lapsed) knows it. The tasks watch the shutdown token; a POST cut by it is
//! attempted again after the restart.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::sign::{EVENT_ID_HEADER, SIGNATURE_HEADER, signature};
use super::{EndpointConfig, FIRST_BACKOFF, Outbox};
use crate::metrics::{EndpointMetrics, WebhookMetrics};
use crate::store::{Attempt, Claimed, DELIVERED_KEPT_MS, Store};

/// How long an endpoint's task waits, with nothing due, before it looks again.
pub const POLL: Duration = Duration::from_secs(2);
/// Events one task attempts at once (each the head of a different thread).
const AT_ONCE: usize = 16;
/// How long a task lets events gather before it claims them, after a wake-up or a pass
/// that was not full: a claim and a record (two store transactions) then serve many runs'
/// events rather than one run's, and the store's queue, which runs wait on to announce,
/// stays short.
const GATHER: Duration = Duration::from_millis(20);
/// A claim outlives its attempt's timeout by this much, so it never lapses while the
/// attempt can still succeed.
const CLAIM_MARGIN: Duration = Duration::from_secs(15);
/// The pause after a store error.
const STORE_PAUSE: Duration = Duration::from_secs(1);
/// How often delivered rows past their keep are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(60 * 60);

/// Why a POST got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Failed(String),
}

/// A POST in flight: the answer's status code.
pub type PostFuture<'a> = Pin<Box<dyn Future<Output = Result<u16, PostError>> + Send + 'a>>;

/// The HTTP client events are POSTed with (lent by the server, as the span exporter's is:
/// `http::transport::webhook`).
pub trait Post: Send + Sync + 'static {
    /// POSTs `body` to `url` with `headers`; the answer's status code, within `timeout`
    /// (connection and response head). The answer's body is not read.
    fn post<'a>(
        &'a self,
        url: &'a http::Uri,
        headers: HeaderMap,
        body: Bytes,
        timeout: Duration,
    ) -> PostFuture<'a>;
}

/// The wait before attempt `n + 1` of an event whose `n`th attempt failed (`n` >= 1):
/// [`FIRST_BACKOFF`] doubled `n - 1` times, at most `max`.
pub fn backoff(n: i64, max: Duration) -> Duration {
    let doublings = u32::try_from(n.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(30);
    FIRST_BACKOFF.saturating_mul(1u32 << doublings).min(max)
}

/// The delivery of every configured endpoint.
pub struct Delivery {
    store: Store,
    endpoints: Vec<EndpointConfig>,
    client: Arc<dyn Post>,
    wake: Arc<Notify>,
    metrics: WebhookMetrics,
    /// This process's name on its claims.
    node: String,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("endpoints", &self.endpoints.len())
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// The delivery of `endpoints` from `store`'s outbox, woken by `outbox`, POSTing with
    /// `client`.
    pub fn new(
        store: Store,
        endpoints: Vec<EndpointConfig>,
        client: Arc<dyn Post>,
        outbox: &Outbox,
    ) -> Delivery {
        Delivery {
            store,
            endpoints,
            client,
            wake: outbox.wake(),
            metrics: outbox.metrics().clone(),
            node: format!("delivery-{}", uuid::Uuid::new_v4()),
        }
    }

    /// Starts one task per endpoint, and the pruning task, on `tracker`; each ends when
    /// `stop` fires.
    pub fn spawn(self, tracker: &TaskTracker, stop: &CancellationToken) {
        let shared = Arc::new(Shared {
            store: self.store,
            client: self.client,
            wake: self.wake,
            node: self.node,
            // Each secret is scrubbed from every log line while the delivery lives.
            _secrets: self
                .endpoints
                .iter()
                .filter_map(|e| std::str::from_utf8(e.secret.expose()).ok())
                .map(crate::logging::register)
                .collect(),
        });
        for endpoint in self.endpoints {
            let metrics = self.metrics.endpoint(&endpoint.name);
            tracker.spawn(run_endpoint(
                shared.clone(),
                endpoint,
                metrics,
                stop.clone(),
            ));
        }
        tracker.spawn(prune(shared, stop.clone()));
    }
}

/// What an endpoint's task shares with the others.
struct Shared {
    store: Store,
    client: Arc<dyn Post>,
    wake: Arc<Notify>,
    node: String,
    _secrets: Vec<crate::logging::SecretGuard>,
}

/// One endpoint's delivery, until `stop`.
async fn run_endpoint(
    shared: Arc<Shared>,
    endpoint: EndpointConfig,
    metrics: EndpointMetrics,
    stop: CancellationToken,
) {
    let claim_ms = (endpoint.timeout + CLAIM_MARGIN).as_millis() as i64;
    // The earliest retry this task scheduled and has not yet made.
    let mut retry_at: Option<tokio::time::Instant> = None;
    while !stop.is_cancelled() {
        // Listening before the claim: an event queued while it runs is not missed.
        let queued = shared.wake.notified();
        tokio::pin!(queued);
        queued.as_mut().enable();
        let claims = tokio::select! {
            () = stop.cancelled() => return,
            claims = shared.store.claim_outgoing(&endpoint.name, &shared.node, AT_ONCE, claim_ms) => claims,
        };
        let claims = match claims {
            Ok(claims) => claims,
            Err(error) => {
                tracing::warn!(%error, endpoint = %endpoint.name, "webhook outbox unreadable; trying again");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(STORE_PAUSE) => continue,
                }
            }
        };
        metrics.pending(claims.pending);
        if claims.rows.is_empty() {
            let now = tokio::time::Instant::now();
            let wait = match retry_at.take() {
                Some(at) if at > now => (at - now).min(POLL),
                Some(_) => Duration::ZERO,
                None => POLL,
            };
            let woken = tokio::select! {
                () = stop.cancelled() => return,
                () = &mut queued => true,
                () = tokio::time::sleep(wait) => false,
            };
            if woken && !pause(&stop, GATHER).await {
                return;
            }
            continue;
        }
        let full = claims.rows.len() == AT_ONCE;
        let attempts = futures_util::future::join_all(
            claims
                .rows
                .into_iter()
                .map(|row| attempt(&*shared.client, &endpoint, row)),
        );
        let attempts = tokio::select! {
            () = stop.cancelled() => return,
            attempts = attempts => attempts,
        };
        for attempt in &attempts {
            match &attempt.failed {
                None => metrics.delivered(),
                Some((_, retry_ms)) => {
                    metrics.failed();
                    let at = tokio::time::Instant::now()
                        + Duration::from_millis(u64::try_from(*retry_ms).unwrap_or(0));
                    retry_at = Some(retry_at.map_or(at, |known| known.min(at)));
                }
            }
        }
        if let Err(error) = shared.store.record_attempts(&shared.node, attempts).await {
            // The claims lapse and the events go out again: a duplicate, never a loss.
            tracing::warn!(%error, endpoint = %endpoint.name, "webhook attempts not recorded");
        }
        if !full && !pause(&stop, GATHER).await {
            return;
        }
    }
}

/// Waits `wait`; `false` when `stop` fired first.
async fn pause(stop: &CancellationToken, wait: Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep(wait) => true,
    }
}

/// One attempt of `row` on `endpoint`.
async fn attempt(client: &dyn Post, endpoint: &EndpointConfig, row: Claimed) -> Attempt {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let body = Bytes::from(row.body);
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::USER_AGENT,
        HeaderValue::from_static(concat!("agui-serve/", env!("CARGO_PKG_VERSION"))),
    );
    // A uuid and a signature are always valid header values.
    if let Ok(id) = HeaderValue::from_str(&row.id) {
        headers.insert(EVENT_ID_HEADER, id);
    }
    if let Ok(signed) = HeaderValue::from_str(&signature(endpoint.secret.expose(), t, &body)) {
        headers.insert(SIGNATURE_HEADER, signed);
    }
    let answer = client
        .post(&endpoint.url, headers, body, endpoint.timeout)
        .await;
    let error = match answer {
        Ok(status) if (200..300).contains(&status) => {
            tracing::debug!(endpoint = %endpoint.name, event.id = %row.id, status, "webhook delivered");
            return Attempt {
                id: row.id,
                endpoint: endpoint.name.clone(),
                failed: None,
            };
        }
        Ok(status) => format!("answered {status}"),
        Err(error) => error.to_string(),
    };
    let n = row.attempts + 1;
    let wait = backoff(n, endpoint.max_backoff);
    tracing::warn!(
        endpoint = %endpoint.name,
        event.id = %row.id,
        attempts = n,
        %error,
        retry_in_ms = wait.as_millis() as u64,
        "webhook not delivered; retrying"
    );
    Attempt {
        id: row.id,
        endpoint: endpoint.name.clone(),
        failed: Some((error, wait.as_millis() as i64)),
    }
}

/// Deletes the delivered rows past their keep, at start and then hourly, until `stop`.
async fn prune(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let before = crate::clock::now_ms() as i64 - DELIVERED_KEPT_MS;
        match shared.store.prune_outbox(before).await {
            Ok(0) => {}
            Ok(rows) => tracing::debug!(rows, "delivered webhook events pruned"),
            Err(error) => tracing::warn!(%error, "webhook outbox not pruned"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PRUNE_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_a_second_up_to_its_cap() {
        let cap = Duration::from_secs(300);
        let waits: Vec<u64> = (1..=11).map(|n| backoff(n, cap).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(backoff(i64::MAX, cap), cap);
        let short = Duration::from_millis(200);
        assert_eq!(backoff(1, short), short);
    }
}
