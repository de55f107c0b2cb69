//! The memory budget: what the runtime holds in memory, counted in bytes, and what it lets
//! go of when the count is over the budget.
//!
//! Counted: every journal's retained frames (exact: the encoded bytes), and each thread's
//! transcript and state document (approximate: their JSON size, brought up to date when a
//! run ends and when a thread is loaded). Over the budget, the runtime first drops the
//! retained frames of finished runs (least recently used thread first; a later reattach
//! into them gets a resync), then evicts idle threads (reloaded from the store when asked
//! for). What a live run holds is bounded on its own: its journal window (frames and
//! bytes), which readers keep from growing (backpressure, see `journal`). So the whole is
//! bounded by the budget plus, per live run, the window and its thread's transcript.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

/// A shared byte count.
#[derive(Debug, Default)]
pub struct Meter(AtomicUsize);

impl Meter {
    pub fn add(&self, bytes: usize) {
        self.0.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn sub(&self, bytes: usize) {
        self.0.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Moves the count from `old` to `new` (one holder's share changed).
    pub fn replace(&self, old: usize, new: usize) {
        if new >= old {
            self.add(new - old);
        } else {
            self.sub(old - new);
        }
    }

    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// Bytes of `value` written as JSON, without building the text.
pub fn json_size(value: &impl Serialize) -> usize {
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Serializing plain data into a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_size_is_the_encoded_length() {
        let value = json!({"a": [1, 2, "three"], "b": null});
        assert_eq!(
            json_size(&value),
            serde_json::to_vec(&value).expect("json").len()
        );
    }

    #[test]
    fn meter_moves_both_ways() {
        let meter = Meter::default();
        meter.add(10);
        meter.replace(10, 25);
        assert_eq!(meter.get(), 25);
        meter.replace(25, 5);
        assert_eq!(meter.get(), 5);
        meter.sub(5);
        assert_eq!(meter.get(), 0);
    }
}
