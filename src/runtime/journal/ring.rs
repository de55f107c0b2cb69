//! The journal's ring of frames, kept in chunks: growing it never moves what it holds (a
//! single buffer doubles and copies itself as a run's journal grows, into fresh pages each
//! time), and each chunk is a small allocation the allocator recycles. The first chunk
//! grows as a plain queue does, so a journal holding a few frames (an idle stream's) holds
//! no more than before.

use std::collections::VecDeque;

/// Frames per chunk.
const CHUNK: usize = 64;

/// A queue of `T` in chunks of [`CHUNK`]: only the first chunk may have lost items at its
/// front, only the last may be short at its back.
#[derive(Debug)]
pub(super) struct Ring<T> {
    chunks: VecDeque<VecDeque<T>>,
    len: usize,
}

impl<T> Default for Ring<T> {
    fn default() -> Self {
        Ring {
            chunks: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> Ring<T> {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Items the ring has room for without allocating.
    pub(super) fn capacity(&self) -> usize {
        self.chunks.iter().map(VecDeque::capacity).sum()
    }

    pub(super) fn push_back(&mut self, item: T) {
        match self.chunks.back_mut() {
            Some(last) if last.len() < CHUNK => last.push_back(item),
            _ => {
                // The first chunk starts small (see the module's docs); later ones whole.
                let mut chunk = if self.chunks.is_empty() {
                    VecDeque::new()
                } else {
                    VecDeque::with_capacity(CHUNK)
                };
                chunk.push_back(item);
                self.chunks.push_back(chunk);
            }
        }
        self.len += 1;
    }

    pub(super) fn pop_front(&mut self) -> Option<T> {
        let first = self.chunks.front_mut()?;
        let item = first.pop_front();
        if first.is_empty() {
            self.chunks.pop_front();
        }
        if item.is_some() {
            self.len -= 1;
        }
        item
    }

    pub(super) fn front(&self) -> Option<&T> {
        self.chunks.front()?.front()
    }

    /// Where item `index` is: its chunk and its place in it.
    fn place(&self, index: usize) -> Option<(usize, usize)> {
        if index >= self.len {
            return None;
        }
        let first = self.chunks.front()?.len();
        if index < first {
            return Some((0, index));
        }
        let rest = index - first;
        Some((1 + rest / CHUNK, rest % CHUNK))
    }

    pub(super) fn get(&self, index: usize) -> Option<&T> {
        let (chunk, at) = self.place(index)?;
        self.chunks.get(chunk)?.get(at)
    }

    /// The items from `start` to `end` (exclusive), in order.
    pub(super) fn range(&self, start: usize, end: usize) -> impl Iterator<Item = &T> {
        (start..end.min(self.len)).filter_map(|index| self.get(index))
    }

    /// Calls `f` on every item from `start` on.
    pub(super) fn for_each_from(&mut self, start: usize, mut f: impl FnMut(&mut T)) {
        let Some((chunk, at)) = self.place(start) else {
            return;
        };
        for (i, items) in self.chunks.range_mut(chunk..).enumerate() {
            let skip = if i == 0 { at } else { 0 };
            items.range_mut(skip..).for_each(&mut f);
        }
    }

    /// Lets go of the room no item uses (the chunks themselves go as they empty).
    pub(super) fn shrink_to_fit(&mut self) {
        if let Some(last) = self.chunks.back_mut() {
            last.shrink_to_fit();
        }
        if let Some(first) = self.chunks.front_mut() {
            first.shrink_to_fit();
        }
        self.chunks.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_a_queue_across_its_chunks() {
        let mut ring = Ring::default();
        let mut model = VecDeque::new();
        // Pushes and pops in an uneven rhythm, across many chunk boundaries.
        for step in 0..2_000usize {
            ring.push_back(step);
            model.push_back(step);
            if step % 3 == 0 {
                assert_eq!(ring.pop_front(), model.pop_front());
            }
            if step % 97 == 0 {
                for _ in 0..50 {
                    assert_eq!(ring.pop_front(), model.pop_front());
                }
            }
            assert_eq!(ring.len(), model.len());
            assert_eq!(ring.front(), model.front());
        }
        for index in [0, 1, 63, 64, 65, model.len() - 1, model.len()] {
            assert_eq!(ring.get(index), model.get(index), "{index}");
        }
        let start = model.len() / 3;
        let end = model.len() - 5;
        assert!(ring.range(start, end).eq(model.range(start..end)));
        ring.for_each_from(start, |item| *item += 1_000_000);
        model.range_mut(start..).for_each(|item| *item += 1_000_000);
        assert!(ring.range(0, ring.len()).eq(model.iter()));
        while let Some(item) = model.pop_front() {
            assert_eq!(ring.pop_front(), Some(item));
        }
        assert_eq!(ring.pop_front(), None);
        assert_eq!((ring.len(), ring.capacity()), (0, 0));
    }

    #[test]
    fn a_few_items_hold_a_small_first_chunk() {
        let mut ring = Ring::default();
        for item in 0..3u64 {
            ring.push_back(item);
        }
        assert!(ring.capacity() < CHUNK, "{}", ring.capacity());
    }
}
