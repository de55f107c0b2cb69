//! The bounded queue from an agent's [`EventSink`](super::EventSink) to its run's pump.
//!
//! One receiver, any number of senders; a sender waits while the queue is full
//! (backpressure). It holds what the pump has not taken yet and nothing more: its buffer is
//! let go whenever the pump finds it empty and waits, so a run whose agent is quiet (an idle
//! stream) keeps only the shared state and its two wake-ups. A general-purpose channel
//! keeps a block of slots and cache-padded fields for its whole life instead.
//!
//! Senders waiting for room are all woken when an item leaves a full queue, and are not
//! served in the order they came: one that arrives while they wake may take the room
//! first. Every agent here reports from its turn's one task; a backend that reports from
//! several tasks at once gets no order between them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::sync::lock;

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Wakes the receiver: an item arrived, or the last sender left.
    arrived: Notify,
    /// Wakes every sender waiting for room: the queue was full and an item left it, or the
    /// receiver is gone.
    room: Notify,
}

struct State<T> {
    queue: VecDeque<T>,
    capacity: usize,
    senders: usize,
    receiver_gone: bool,
}

/// The agent's end; cloned for each part of an agent that reports.
pub(crate) struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The pump's end.
pub(crate) struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// A queue holding at most `capacity` items (at least one).
pub(crate) fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            capacity: capacity.max(1),
            senders: 1,
            receiver_gone: false,
        }),
        arrived: Notify::new(),
        room: Notify::new(),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

impl<T> Sender<T> {
    /// Queues `item`, waiting while the queue is full; `Err(item)` once the receiver is
    /// gone. Dropping the future while it waits queues nothing.
    pub(crate) async fn send(&self, item: T) -> Result<(), T> {
        loop {
            let room = {
                let mut state = lock(&self.shared.state);
                if state.receiver_gone {
                    return Err(item);
                }
                if state.queue.len() < state.capacity {
                    let was_empty = state.queue.is_empty();
                    if state.queue.capacity() == 0 {
                        // One slot where the pump keeps up; more as a burst needs them.
                        state.queue.reserve_exact(1);
                    }
                    state.queue.push_back(item);
                    drop(state);
                    // The receiver waits only on an empty queue (it checks under the lock
                    // first); a wake-up while it is busy is kept for its next wait.
                    if was_empty {
                        self.shared.arrived.notify_one();
                    }
                    return Ok(());
                }
                // Made under the lock: the room the receiver makes next (it wakes every
                // waiting sender after taking an item under this lock) reaches this one.
                self.shared.room.notified()
            };
            room.await;
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        lock(&self.shared.state).senders += 1;
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let last = {
            let mut state = lock(&self.shared.state);
            state.senders -= 1;
            state.senders == 0
        };
        if last {
            self.shared.arrived.notify_one();
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

impl<T> Receiver<T> {
    /// The next item, waiting for one; `None` once every sender is gone and the queue is
    /// empty. Dropping the future while it waits loses nothing.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        loop {
            let arrived = self.shared.arrived.notified();
            let buffer = {
                let mut state = lock(&self.shared.state);
                if let Some(item) = state.queue.pop_front() {
                    let was_full = state.queue.len() + 1 >= state.capacity;
                    drop(state);
                    self.made_room(was_full);
                    return Some(item);
                }
                if state.senders == 0 {
                    return None;
                }
                // About to wait: the buffer goes (a quiet run keeps none).
                std::mem::take(&mut state.queue)
            };
            drop(buffer);
            arrived.await;
        }
    }

    /// The next item if one is queued.
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        let mut state = lock(&self.shared.state);
        let item = state.queue.pop_front()?;
        let was_full = state.queue.len() + 1 >= state.capacity;
        drop(state);
        self.made_room(was_full);
        Some(item)
    }

    /// Wakes the senders waiting for room once an item left a full queue (after the lock
    /// is let go: they take it next).
    fn made_room(&self, was_full: bool) {
        if was_full {
            self.shared.room.notify_waiters();
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // What is still queued is dropped here, outside the lock (an item may carry the
        // other end of a reply its sender waits on: that wait ends now, not with the last
        // sender).
        let queued = {
            let mut state = lock(&self.shared.state);
            state.receiver_gone = true;
            std::mem::take(&mut state.queue)
        };
        self.shared.room.notify_waiters();
        drop(queued);
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `wait`'s output, or a failure naming a wake-up that never came (time is paused, so
    /// the minute passes at once when nothing else can happen).
    async fn within<F: std::future::Future>(wait: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .expect("a wake-up never came")
    }

    #[tokio::test]
    async fn items_arrive_in_order_and_the_end_follows_the_last_sender() {
        let (tx, mut rx) = bounded(4);
        let other = tx.clone();
        tx.send(1).await.expect("open");
        other.send(2).await.expect("open");
        drop(tx);
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.try_recv(), Some(2));
        assert_eq!(rx.try_recv(), None);
        drop(other);
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sender_waits_while_the_queue_is_full_and_every_waiting_sender_gets_in() {
        let (tx, mut rx) = bounded(2);
        tx.send(0).await.expect("open");
        tx.send(1).await.expect("open");
        let mut waiting = Vec::new();
        for i in 2..6 {
            let tx = tx.clone();
            waiting.push(tokio::spawn(async move { tx.send(i).await.is_ok() }));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            waiting.iter().all(|task| !task.is_finished()),
            "the queue is full"
        );
        drop(tx);
        let mut got = Vec::new();
        while let Some(item) = within(rx.recv()).await {
            got.push(item);
        }
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3, 4, 5]);
        for task in waiting {
            assert!(within(task).await.expect("task"));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_receiver_that_leaves_releases_waiting_senders_and_drops_what_was_queued() {
        let (tx, rx) = bounded(1);
        let (reply, answer) = tokio::sync::oneshot::channel::<()>();
        tx.send(Some(reply)).await.expect("open");
        let blocked = {
            let tx = tx.clone();
            tokio::spawn(async move { tx.send(None).await.is_err() })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!blocked.is_finished());
        drop(rx);
        assert!(
            within(blocked).await.expect("task"),
            "refused once the receiver left"
        );
        assert!(
            answer.await.is_err(),
            "the queued reply was dropped with the receiver"
        );
        assert!(tx.send(None).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_receiver_lets_its_buffer_go_while_it_waits_and_wakes_for_the_next_item() {
        let (tx, mut rx) = bounded(8);
        for i in 0..8 {
            tx.send(i).await.expect("open");
        }
        while rx.try_recv().is_some() {}
        assert!(lock(&rx.shared.state).queue.capacity() >= 8);
        let waited = tokio::time::timeout(Duration::from_millis(10), rx.recv()).await;
        assert!(waited.is_err(), "nothing to take");
        assert_eq!(lock(&rx.shared.state).queue.capacity(), 0, "no buffer kept");
        let waiting = tokio::spawn(async move { rx.recv().await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send(42).await.expect("open");
        assert_eq!(within(waiting).await.expect("task"), Some(42));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_receiver_learns_the_last_sender_left() {
        let (tx, mut rx) = bounded::<u32>(4);
        let waiting = tokio::spawn(async move { rx.recv().await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(tx);
        assert_eq!(within(waiting).await.expect("task"), None);
    }

    /// Polled by hand: a wait dropped part-way (as a `select!` drops the branches it did
    /// not take) loses neither an item nor another sender's wake-up.
    #[test]
    fn a_wait_dropped_part_way_loses_nothing() {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let mut cx = Context::from_waker(Waker::noop());

        let (tx, mut rx) = bounded::<u32>(1);
        {
            let mut waiting = std::pin::pin!(rx.recv());
            assert!(waiting.as_mut().poll(&mut cx).is_pending());
            assert!(std::pin::pin!(tx.send(7)).poll(&mut cx).is_ready());
            // Woken, then dropped without being polled again.
        }
        assert_eq!(
            std::pin::pin!(rx.recv()).poll(&mut cx),
            Poll::Ready(Some(7))
        );

        let other = tx.clone();
        assert!(std::pin::pin!(tx.send(0)).poll(&mut cx).is_ready());
        let mut first = Box::pin(tx.send(1));
        let mut second = Box::pin(other.send(2));
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert_eq!(rx.try_recv(), Some(0));
        // Both were woken; the first gives up: the second still gets the room.
        drop(first);
        assert!(second.as_mut().poll(&mut cx).is_ready());
        assert_eq!(rx.try_recv(), Some(2));
    }
}
