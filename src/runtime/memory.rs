//! The memory budget: what the runtime holds in memory, counted in bytes, and what it lets
//! go of when the count is over the budget.
//!
//! Counted: every journal's retained frames (exact: the encoded bytes), and each thread's
//! transcript and state document (approximate: their JSON size, brought up to date when a
//! run ends and when a thread is loaded). The count is held to the budget less what is set
//! aside for the process itself ([`process_reserve`], [`retained_limit`]). Over that, the
//! runtime first drops the retained frames of finished runs (least recently used thread
//! first; a later reattach into them gets a resync), then evicts idle threads (reloaded from
//! the store when asked for). What a live run holds is bounded on its own: its journal
//! window (frames and bytes), which readers keep from growing (backpressure, see
//! `journal`). So the process is bounded by the budget plus, per live run, the window and
//! its thread's transcript.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

/// What [`process_reserve`] sets aside besides the process's size at start: the runtime's
/// threads and the store's caches as they warm up, and the allocator's slack, whatever the
/// budget (measured: about 35 MB above the starting size once retained data has churned).
const FIXED_RESERVE: usize = 32 * 1024 * 1024;

/// Bytes of a budget of `budget` set aside for the process itself, when its resident size
/// now (at start) is `resident`: that size, [`FIXED_RESERVE`], and an eighth of the budget
/// for the allocator's slack on what is retained (freed frames stay in its free lists).
pub fn process_reserve(budget: usize, resident: usize) -> usize {
    resident + FIXED_RESERVE + budget / 8
}

/// What retained data may hold under `budget` with `reserved` set aside: the rest, but
/// never under an eighth of the budget (a budget smaller than the process needs still
/// keeps some frames and threads, and is then exceeded).
pub fn retained_limit(budget: usize, reserved: usize) -> usize {
    budget.saturating_sub(reserved).max(budget / 8)
}

/// This process's resident set size in bytes (Linux: `VmRSS` of `/proc/self/status`).
pub fn resident_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        let kb = line.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?;
        kb.trim().parse::<usize>().ok().map(|kb| kb * 1024)
    })
}

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

/// Bytes counted against the budget for as long as this is held (a queued item's input).
#[derive(Debug)]
pub struct Charge {
    meter: std::sync::Arc<Meter>,
    bytes: usize,
}

impl Charge {
    pub fn new(meter: &std::sync::Arc<Meter>, bytes: usize) -> Charge {
        meter.add(bytes);
        Charge {
            meter: meter.clone(),
            bytes,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.meter.sub(self.bytes);
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
    fn the_process_reserve_comes_off_the_budget_but_never_all_of_it() {
        const MIB: usize = 1024 * 1024;
        let reserved = process_reserve(256 * MIB, 20 * MIB);
        assert_eq!(reserved, 20 * MIB + 32 * MIB + 32 * MIB);
        assert_eq!(retained_limit(256 * MIB, reserved), 172 * MIB);
        assert_eq!(retained_limit(256 * MIB, 0), 256 * MIB);
        let reserved = process_reserve(16 * MIB, 20 * MIB);
        assert_eq!(retained_limit(16 * MIB, reserved), 2 * MIB);
    }

    #[test]
    fn the_resident_size_is_read_where_the_system_shows_it() {
        if cfg!(target_os = "linux") {
            assert!(resident_bytes().is_some_and(|bytes| bytes > 0));
        }
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
