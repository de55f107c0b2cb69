//! One subscriber of the fleet stream: a cursor into the shared history, and the frames
//! it takes in turn (replay, snapshot, then each change).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::sync::lock;

use super::*;

/// One subscriber's stream of fleet frames: a cursor into its view's shared frames.
pub struct FleetStream {
    pub(super) fleet: Arc<Fleet>,
    pub(super) view: View,
    /// The namespace it is counted under.
    pub(super) namespace: String,
    /// The last sequence number this subscriber has been given (or skipped as invisible).
    pub(super) cursor: u64,
    pub(super) queue: VecDeque<Bytes>,
    pub(super) changed: watch::Receiver<u64>,
    pub(super) stop: CancellationToken,
    pub(super) keep_alive: Duration,
    pub(super) exact: bool,
    pub(super) ended: bool,
}

/// What a fleet subscriber gets next.
#[derive(Debug)]
pub enum FleetItem {
    /// An encoded event frame (id, data with its timestamp).
    Frame(Bytes),
    /// Nothing for a keep-alive period.
    KeepAlive,
}

impl Drop for FleetStream {
    fn drop(&mut self) {
        let mut history = lock(&self.fleet.history);
        let history = &mut *history;
        if let Some(shared) = history.views.get_mut(&self.view) {
            shared.subscribers -= 1;
            if shared.subscribers == 0 {
                self.fleet.meter.sub(shared.metered);
                history.views.remove(&self.view);
            }
        }
        if let Some(open) = history.open.get_mut(&self.namespace) {
            *open -= 1;
            if *open == 0 {
                history.open.remove(&self.namespace);
            }
        }
        history.total = history.total.saturating_sub(1);
        history.last_left = Some(std::time::Instant::now());
    }
}

impl FleetStream {
    /// Whether the replay honoured the subscriber's cursor (`agui-resume: exact`) or the
    /// snapshot replaces it (`resync`).
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// The next item; `None` when the stream ends (shutdown, or this subscriber fell so
    /// far behind that the patches it needs are gone: it reconnects and resyncs).
    pub async fn next(&mut self) -> Option<FleetItem> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(frame) = self.queue.pop_front() {
                return Some(FleetItem::Frame(frame));
            }
            if self.stop.is_cancelled() {
                self.ended = true;
                return None;
            }
            self.changed.borrow_and_update();
            let caught_up = {
                let history = lock(&self.fleet.history);
                let last = history.last_seq();
                // Ended while what it needs is still kept (a quarter of the history
                // behind), so its reconnect from its last id replays exactly.
                if last.saturating_sub(self.cursor) > self.fleet.window() {
                    false
                } else {
                    if let Some(shared) = history.views.get(&self.view) {
                        self.queue.extend(
                            shared
                                .frames
                                .iter()
                                .filter(|(seq, _)| *seq > self.cursor)
                                .map(|(_, frame)| frame.clone()),
                        );
                    }
                    self.cursor = last;
                    true
                }
            };
            if !caught_up {
                tracing::info!(
                    cursor = self.cursor,
                    "fleet subscriber fell behind; ended (it reconnects and replays)"
                );
                self.ended = true;
                return None;
            }
            if !self.queue.is_empty() {
                continue;
            }
            tokio::select! {
                changed = self.changed.changed() => {
                    if changed.is_err() {
                        self.ended = true;
                        return None;
                    }
                }
                () = self.stop.cancelled() => {}
                () = tokio::time::sleep(self.keep_alive) => return Some(FleetItem::KeepAlive),
            }
        }
    }
}
