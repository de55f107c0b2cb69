//! Which threads the embedded store may hold: a Bloom filter over their ids, filled from
//! the database at open and by every write that creates a thread. "Not there" is certain,
//! so a request for a thread nobody has used (a conversation's first message) needs no
//! read of the store before its run starts; "maybe there" costs the read it always cost.
//! Ids are never taken out (a deleted thread reads as "maybe"), and the filter is sized at
//! open: past its capacity it answers "maybe" more often, never wrongly "not there".
//! Sound because this process is the database's only writer: a daemon holds its data
//! directory's lock (`Store::lock_data_dir`) while it runs.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bits per id the filter is sized for (about 0.5% false "maybe" at capacity).
const BITS_PER_ID: usize = 12;
/// Probes per id.
const PROBES: u64 = 7;
/// The smallest filter: room for about 87 000 ids in 128 KiB.
const MIN_BITS: usize = 1 << 20;

pub(super) struct KnownThreads {
    words: Box<[AtomicU64]>,
    /// The number of bits, a power of two.
    mask: u64,
}

impl KnownThreads {
    /// A filter with room for `expected` ids (at least [`MIN_BITS`] bits).
    pub(super) fn with_capacity(expected: usize) -> KnownThreads {
        let bits = expected
            .saturating_mul(BITS_PER_ID)
            .max(MIN_BITS)
            .next_power_of_two();
        KnownThreads {
            words: (0..bits / 64).map(|_| AtomicU64::new(0)).collect(),
            mask: bits as u64 - 1,
        }
    }

    /// Records that the store may hold thread `id` (before the write that creates it is
    /// queued).
    pub(super) fn add(&self, id: &str) {
        for bit in self.bits(id) {
            self.words[(bit / 64) as usize].fetch_or(1 << (bit % 64), Ordering::Release);
        }
    }

    /// `false` only when the store certainly does not hold thread `id`.
    pub(super) fn may_hold(&self, id: &str) -> bool {
        self.bits(id).into_iter().all(|bit| {
            self.words[(bit / 64) as usize].load(Ordering::Acquire) & (1 << (bit % 64)) != 0
        })
    }

    /// The bits of `id`: double hashing over one 64-bit hash.
    fn bits(&self, id: &str) -> [u64; PROBES as usize] {
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(id);
        let (a, b) = (hash, hash.rotate_left(32) | 1);
        std::array::from_fn(|i| a.wrapping_add((i as u64).wrapping_mul(b)) & self.mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_added_may_be_held_and_most_of_the_rest_is_certainly_not() {
        let known = KnownThreads::with_capacity(10_000);
        for i in 0..10_000 {
            known.add(&format!("thread-{i}"));
        }
        assert!((0..10_000).all(|i| known.may_hold(&format!("thread-{i}"))));
        let maybe = (0..100_000)
            .filter(|i| known.may_hold(&format!("other-{i}")))
            .count();
        // Far under capacity: almost every unknown id is answered "not there".
        assert!(maybe < 100, "{maybe} of 100 000 unknown ids answered maybe");
    }
}
