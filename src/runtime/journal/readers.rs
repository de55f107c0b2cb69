//! The journal's registered readers, by position.

/// A reader's key: the last sequence it has taken, and its id.
pub(super) type Key = (u64, u64);

/// Registered readers sorted by key, each with when the stall check first saw it behind
/// (ms), if it has. A sorted vector rather than a tree: a journal has one reader or a few,
/// and one takes a slot of 32 bytes where a tree's first node took hundreds.
#[derive(Debug, Default)]
pub(super) struct Readers {
    sorted: Vec<(Key, Option<u64>)>,
}

impl Readers {
    pub(super) fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The key of the reader furthest behind.
    pub(super) fn first(&self) -> Option<Key> {
        self.sorted.first().map(|(key, _)| *key)
    }

    pub(super) fn insert(&mut self, key: Key, behind_since: Option<u64>) {
        let at = self.sorted.partition_point(|(k, _)| *k < key);
        if self.sorted.capacity() == 0 {
            self.sorted.reserve_exact(1);
        }
        self.sorted.insert(at, (key, behind_since));
    }

    /// Removes the reader with `key`; whether it was there.
    pub(super) fn remove(&mut self, key: &Key) -> bool {
        match self.sorted.binary_search_by(|(k, _)| k.cmp(key)) {
            Ok(at) => {
                self.sorted.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    /// The readers whose key is below `bound`, in order.
    pub(super) fn below_mut(
        &mut self,
        bound: Key,
    ) -> impl Iterator<Item = (Key, &mut Option<u64>)> {
        self.sorted
            .iter_mut()
            .take_while(move |(key, _)| *key < bound)
            .map(|(key, since)| (*key, since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_keeps_readers_in_key_order() {
        let mut readers = Readers::default();
        for key in [(5, 1), (2, 0), (9, 2), (2, 3)] {
            readers.insert(key, None);
        }
        assert_eq!(readers.first(), Some((2, 0)));
        assert!(readers.remove(&(2, 0)));
        assert!(!readers.remove(&(2, 0)));
        let below: Vec<Key> = readers.below_mut((9, 0)).map(|(key, _)| key).collect();
        assert_eq!(below, vec![(2, 3), (5, 1)]);
        for (_, since) in readers.below_mut((6, 0)) {
            *since = Some(7);
        }
        assert!(readers.remove(&(2, 3)) && readers.remove(&(5, 1)) && readers.remove(&(9, 2)));
        assert!(readers.is_empty());
    }
}
