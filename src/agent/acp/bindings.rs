//! Which session each thread is bound to, a room of its own: the live binding (marked used
//! by every turn, taken by the reaper once idle), how a session bound outside a turn came
//! (the thread's first turn shows it), and the input a failed turn did not deliver.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::bind::Announce;
use super::lock;
use super::pool::Bound;
use super::process::AcpProcess;
use crate::protocol::input::Message;

#[derive(Default)]
pub(super) struct Bindings {
    /// thread key -> its live session.
    by_thread: Mutex<HashMap<String, Bound>>,
    /// thread key -> how its session came (imported, forked, loaded ahead, a spare's), for
    /// threads whose session was bound outside a turn.
    outside: Mutex<HashMap<String, Announce>>,
    /// thread key -> messages the agent has not received (their turn failed before it
    /// accepted the prompt).
    undelivered: Mutex<HashMap<String, Vec<Message>>>,
}

impl Bindings {
    /// Binds `thread` to `bound` (used now).
    pub(super) fn bind(&self, thread: &str, bound: Bound) {
        lock(&self.by_thread).insert(thread.to_owned(), bound);
    }

    /// Marks the thread's session used now (a turn began or ended on it).
    pub(super) fn touch(&self, thread: &str) {
        if let Some(bound) = lock(&self.by_thread).get_mut(thread) {
            bound.used = tokio::time::Instant::now();
        }
    }

    /// The thread's session, marked used at once (so the reaper cannot take it between
    /// the look and the turn).
    pub(super) fn take_up(&self, thread: &str) -> Option<Bound> {
        lock(&self.by_thread).get_mut(thread).map(|bound| {
            bound.used = tokio::time::Instant::now();
            bound.clone()
        })
    }

    /// The thread's session while its process lives.
    pub(super) fn live(&self, thread: &str) -> Option<Bound> {
        lock(&self.by_thread)
            .get(thread)
            .filter(|b| b.process.is_alive())
            .cloned()
    }

    /// Whether the thread was ever bound in this process's memory.
    pub(super) fn has(&self, thread: &str) -> bool {
        lock(&self.by_thread).contains_key(thread)
    }

    /// The thread a live process holds session `session` for.
    pub(super) fn holder_of(&self, session: &str) -> Option<String> {
        lock(&self.by_thread)
            .iter()
            .find(|(_, b)| b.session == session && b.process.is_alive())
            .map(|(thread, _)| thread.clone())
    }

    /// Every binding to `process` let go (it stopped).
    pub(super) fn forget_process(&self, process: &Arc<AcpProcess>) {
        lock(&self.by_thread).retain(|_, b| !Arc::ptr_eq(&b.process, process));
    }

    /// Sessions no turn has used for `ttl` and nobody listens to, taken out.
    pub(super) fn take_idle(&self, ttl: Duration) -> Vec<Bound> {
        let mut by_thread = lock(&self.by_thread);
        let idle: Vec<String> = by_thread
            .iter()
            .filter(|(_, b)| b.used.elapsed() >= ttl && !b.process.router.is_listening(&b.session))
            .map(|(thread, _)| thread.clone())
            .collect();
        idle.iter().filter_map(|t| by_thread.remove(t)).collect()
    }

    /// Everything of `thread` let go; its session, if it had one, for the caller to close.
    pub(super) fn forget(&self, thread: &str) -> Option<Bound> {
        lock(&self.undelivered).remove(thread);
        lock(&self.outside).remove(thread);
        lock(&self.by_thread).remove(thread)
    }

    /// Every binding let go (at shutdown).
    pub(super) fn clear(&self) {
        lock(&self.by_thread).clear();
    }

    /// The thread's session was bound outside a turn, as `announce` says.
    pub(super) fn bound_outside(&self, thread: &str, announce: Announce) {
        lock(&self.outside).insert(thread.to_owned(), announce);
    }

    /// How the thread's session came, once (its first turn shows it).
    pub(super) fn take_announce(&self, thread: &str) -> Option<Announce> {
        lock(&self.outside).remove(thread)
    }

    /// The input the thread's last turn did not deliver, taken.
    pub(super) fn take_undelivered(&self, thread: &str) -> Vec<Message> {
        lock(&self.undelivered).remove(thread).unwrap_or_default()
    }

    /// Keeps input the agent did not receive for the thread's next prompt.
    pub(super) fn keep_undelivered(&self, thread: &str, input: Vec<Message>) {
        lock(&self.undelivered).insert(thread.to_owned(), input);
    }
}
