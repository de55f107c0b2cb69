//! The per-thread replay journal: a bounded ring of encoded SSE frames.
//!
//! One writer (the run's pump) appends; any number of readers follow by cursor. Readers
//! that follow live (attachments) register their position: the ring drops its oldest frames
//! when it exceeds its count or byte bound, but never a frame a registered reader has not
//! taken yet. Instead the writer waits ([`Journal::room`]) while the slowest registered
//! reader is a whole window behind: a reader that keeps reading gets every frame, however
//! fast the agent produces, and memory stays bounded by the window (plus the one item being
//! written, so a frame larger than the window is still delivered). A reader that stops
//! reading is cut by its stream after the stall timeout, which unregisters it and lets the
//! writer go on. A reader whose cursor is no longer retained (a reattach long after) gets a
//! [`Gap`] instead of a silent skip.
//!
//! Frame ids carry the daemon's boot epoch and a per-thread sequence number, so they are
//! strictly increasing within a thread and an id from an earlier boot is recognisable.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{Notify, watch};

use super::memory::Meter;
use readers::Readers;
use ring::Ring;

mod readers;
mod ring;
use crate::protocol::{Event, Profile, event_frame, frame_into};

/// A block is sealed once its frames reach this many bytes, so a reader's chunk (16 kB at
/// most) is a slice of one block, and a block a retained frame keeps alive stays small.
const BLOCK_BYTES: usize = 16 * 1024;

/// The writing buffer a journal takes for a block and gives back once it is sealed, kept
/// per worker thread: a journal holds none between its batches (an idle stream's thread
/// holds no buffer), and a batch grows no new one.
mod spare {
    use std::cell::RefCell;

    /// A buffer grown larger than this is let go rather than kept.
    const KEEP: usize = 64 * 1024;

    thread_local! {
        static SPARE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }

    /// The thread's spare buffer (empty, perhaps without capacity).
    pub(super) fn take() -> Vec<u8> {
        SPARE.with(|spare| std::mem::take(&mut *spare.borrow_mut()))
    }

    /// Keeps `buffer` (cleared) as the thread's spare, unless a larger one is kept already.
    pub(super) fn put(mut buffer: Vec<u8>) {
        if buffer.capacity() > KEEP {
            return;
        }
        buffer.clear();
        SPARE.with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.capacity() < buffer.capacity() {
                *spare = buffer;
            }
        });
    }
}

/// Bounds of one thread's journal.
#[derive(Debug, Clone, Copy)]
pub struct JournalLimits {
    pub max_frames: usize,
    pub max_bytes: usize,
}

impl Default for JournalLimits {
    fn default() -> Self {
        JournalLimits {
            max_frames: 4096,
            max_bytes: 4 * 1024 * 1024,
        }
    }
}

/// An event id: boot epoch, the thread's journal tag, and the per-thread sequence, written
/// `<epoch>-<tag>-<seq>` in hex. The tag (random per journal) makes an id from another
/// thread, or from a journal that was dropped and rebuilt, unusable as a cursor here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId {
    pub epoch: u64,
    pub tag: u32,
    pub seq: u64,
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.encode(&mut IdBuf::default()))
    }
}

/// Room for the longest id: 16 + 1 + 8 + 1 + 16 hex digits and dashes.
struct IdBuf([u8; 42]);

impl Default for IdBuf {
    fn default() -> IdBuf {
        IdBuf([0; 42])
    }
}

/// Writes `value` in lowercase hex, at least `width` digits, ending at `end`; returns the
/// start.
fn put_hex(buf: &mut [u8], end: usize, mut value: u64, width: usize) -> usize {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut at = end;
    while value != 0 || end - at < width.max(1) {
        at -= 1;
        buf[at] = DIGITS[(value & 0xf) as usize];
        value >>= 4;
    }
    at
}

impl EventId {
    /// The id as text (`<epoch>-<tag>-<seq>`, hex; tag and seq at least 8 digits), written
    /// into `buf` without the formatting machinery (it is on every frame's path).
    fn encode<'b>(&self, buf: &'b mut IdBuf) -> &'b str {
        let buf = &mut buf.0;
        let end = buf.len();
        let mut at = put_hex(buf, end, self.seq, 8);
        at -= 1;
        buf[at] = b'-';
        at = put_hex(buf, at, u64::from(self.tag), 8);
        at -= 1;
        buf[at] = b'-';
        at = put_hex(buf, at, self.epoch, 1);
        // Only ASCII hex digits and dashes were written.
        std::str::from_utf8(&buf[at..]).unwrap_or_default()
    }
}

impl EventId {
    /// Parses an id as written by `Display`; `None` when malformed.
    pub fn parse(text: &str) -> Option<EventId> {
        let mut parts = text.trim().split('-');
        let (epoch, tag, seq) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        fn field(s: &str, max: usize) -> Option<&str> {
            (!s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .then_some(s)
        }
        Some(EventId {
            epoch: u64::from_str_radix(field(epoch, 16)?, 16).ok()?,
            tag: u32::from_str_radix(field(tag, 8)?, 16).ok()?,
            seq: u64::from_str_radix(field(seq, 16)?, 16).ok()?,
        })
    }
}

/// One journal entry: the frame as each client profile receives it.
///
/// The frames the writer appends between two wake-ups of the readers are encoded one after
/// another into one buffer, the block, that they share (see [`Journal::publish`]): one
/// allocation for the lot, and a reader sends consecutive frames of a block as one slice
/// of it, without copying them ([`Frame::continues`]).
#[derive(Debug, Clone)]
pub struct Frame {
    pub seq: u64,
    /// The encodings of this frame's block (empty until the block is sealed).
    block: Bytes,
    /// This frame's 1.0 encoding: `block[start..end]`.
    start: usize,
    end: usize,
    /// The pre-1.0 encoding, when it differs (rare: a run's end; boxed, so the ring's slots
    /// stay small).
    legacy: Option<Box<Bytes>>,
    /// This frame is a segment's terminal event: a stream following the segment ends here.
    pub ends_segment: bool,
    /// This frame is a segment's `RUN_STARTED`.
    pub starts_segment: bool,
    /// Bytes of every frame journaled before this one (for the window's byte count).
    offset: u64,
}

impl Frame {
    /// Bytes of this frame's encodings.
    fn size(&self) -> usize {
        self.end - self.start + self.legacy.as_ref().map_or(0, |legacy| legacy.len())
    }

    /// Heap allocations holding the encodings: a block's first frame counts the block.
    fn buffers(&self) -> usize {
        usize::from(self.start == 0) + 2 * usize::from(self.legacy.is_some())
    }

    /// Bytes of the frame a client of `profile` receives.
    pub fn len(&self, profile: Profile) -> usize {
        match (profile, &self.legacy) {
            (Profile::Legacy, Some(legacy)) => legacy.len(),
            _ => self.end - self.start,
        }
    }

    /// The bytes for a client of `profile`.
    pub fn bytes(&self, profile: Profile) -> Bytes {
        match (profile, &self.legacy) {
            (Profile::Legacy, Some(legacy)) => Bytes::clone(legacy),
            _ => self.block.slice(self.start..self.end),
        }
    }

    /// The bytes for a client of `profile`, borrowed.
    pub fn data(&self, profile: Profile) -> &[u8] {
        match (profile, &self.legacy) {
            (Profile::Legacy, Some(legacy)) => legacy,
            _ => &self.block[self.start..self.end],
        }
    }

    /// When `chunk` (bytes already taken for a client of `profile`) ends right where this
    /// frame's bytes for that client begin, in the same block: `chunk` and this frame as
    /// one slice of the block, without a copy. A chunk can only lie inside the block's
    /// memory if it is part of it: both are alive.
    pub fn continues(&self, chunk: &Bytes, profile: Profile) -> Option<Bytes> {
        if profile == Profile::Legacy && self.legacy.is_some() {
            return None;
        }
        let base = self.block.as_ptr() as usize;
        let at = chunk.as_ptr() as usize;
        let from = at.checked_sub(base)?;
        (!chunk.is_empty() && from + chunk.len() == self.start && self.end <= self.block.len())
            .then(|| self.block.slice(from..self.end))
    }
}

/// The requested position is no longer (or never was) in the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap;

/// A thread's journal.
#[derive(Debug)]
pub struct Journal {
    epoch: u64,
    tag: u32,
    limits: JournalLimits,
    inner: Mutex<Inner>,
    /// The sequence number of the newest frame; readers wait on it.
    latest: watch::Sender<u64>,
    /// Signalled when a registered reader advances or leaves; the writer waits on it.
    advanced: Notify,
    /// Counts the retained frames' bytes into the runtime's memory budget.
    meter: Arc<Meter>,
}

/// A registered reader's place in the journal (see [`Journal::register`]). Dropping it
/// without [`Journal::unregister`] leaves the position pinned, so attachments unregister in
/// their `Drop`.
#[derive(Debug)]
pub struct ReaderSlot {
    id: u64,
    cursor: u64,
}

/// The reader was cut for taking nothing for the stall timeout (see
/// [`Journal::cut_stalled`]); its registration is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut;

#[derive(Debug)]
struct Inner {
    frames: Ring<Frame>,
    /// The encodings of the frames after `sealed_through`, the block being written.
    open: Vec<u8>,
    /// Frames up to this sequence have their bytes; later ones are in `open` and are not
    /// handed to readers until [`Inner::seal`].
    sealed_through: u64,
    /// Bytes of the retained frames' encodings (what the window bounds).
    bytes: usize,
    /// Heap allocations of the retained frames' encodings.
    buffers: usize,
    next_seq: u64,
    /// The sequence of the newest frame that ends a segment (0 before the first): what
    /// follows it is whole segments.
    boundary: u64,
    /// Frames with a sequence at or below this were evicted.
    evicted_through: u64,
    /// Frames with a sequence at or below this were released (see [`Journal::release`]):
    /// those a registered reader was still taking leave as it takes them.
    released_through: u64,
    /// Bytes of every frame ever journaled.
    total: u64,
    /// Registered readers by cursor (the last sequence each has taken) and id; the value
    /// is when the stall check first saw the reader behind at that cursor (ms), if it has.
    readers: Readers,
    next_reader: u64,
    /// Readers cut for stalling that have not noticed yet.
    cut: HashSet<u64>,
}

impl Inner {
    /// What the retained frames cost in memory: their encodings, per buffer the
    /// allocator's bookkeeping (16 bytes) and the shared header `Bytes` allocates when a
    /// frame is first handed to a reader (32), and the ring's slots (counted by capacity).
    fn held(&self) -> usize {
        const PER_BUFFER: usize = 16 + 32;
        self.bytes
            + self.buffers * PER_BUFFER
            + self.frames.capacity() * std::mem::size_of::<Frame>()
            + self.open.capacity()
    }

    /// Gives the frames written since the last seal their bytes: one buffer of exactly the
    /// block's size, shared by them. The writing buffer goes back to the thread's spare.
    fn seal(&mut self) {
        let last = self.next_seq - 1;
        if self.sealed_through == last {
            return;
        }
        let block = Bytes::copy_from_slice(&self.open);
        let first = self.index_of(self.sealed_through + 1);
        self.frames
            .for_each_from(first, |frame| frame.block = block.clone());
        self.sealed_through = last;
        spare::put(std::mem::take(&mut self.open));
    }

    /// Evicts the released frames no registered reader needs any more (see
    /// [`Journal::release`]); returns the bytes freed.
    fn drop_released(&mut self) -> usize {
        let released = self.released_through;
        if self.frames.front().is_none_or(|f| f.seq > released) {
            return 0;
        }
        let before = self.held();
        let until = self.needed_from().min(released + 1);
        while self.frames.front().is_some_and(|f| f.seq < until) {
            self.evict_oldest();
        }
        if self.frames.front().is_none_or(|f| f.seq > released) {
            self.frames.shrink_to_fit();
        }
        before.saturating_sub(self.held())
    }

    /// Forgets the oldest retained frame.
    fn evict_oldest(&mut self) {
        if let Some(old) = self.frames.pop_front() {
            self.bytes -= old.size();
            self.buffers -= old.buffers();
            self.evicted_through = old.seq;
        }
    }

    /// The oldest sequence a registered reader still needs (`u64::MAX` when none).
    fn needed_from(&self) -> u64 {
        self.readers
            .first()
            .map_or(u64::MAX, |(cursor, _)| cursor + 1)
    }

    /// Where the frame with sequence `seq` is (or would be) in the ring: the retained frames
    /// are contiguous, right after the evicted ones.
    fn index_of(&self, seq: u64) -> usize {
        let first = self.evicted_through + 1;
        (seq.saturating_sub(first) as usize).min(self.frames.len())
    }

    /// Whether the retained frames a registered reader still needs fill the window.
    fn window_full(&self, limits: &JournalLimits) -> bool {
        let start = self.index_of(self.needed_from());
        let Some(oldest) = self.frames.get(start) else {
            return false;
        };
        let behind = self.frames.len() - start;
        let bytes = self.total - oldest.offset;
        behind >= limits.max_frames || bytes >= limits.max_bytes as u64
    }
}

impl Journal {
    pub fn new(epoch: u64, limits: JournalLimits) -> Journal {
        Journal::metered(epoch, limits, Arc::default())
    }

    /// A journal whose retained bytes are counted in `meter`.
    pub fn metered(epoch: u64, limits: JournalLimits, meter: Arc<Meter>) -> Journal {
        Journal {
            epoch,
            tag: getrandom::u32().expect("the OS random generator"),
            limits,
            inner: Mutex::new(Inner {
                frames: Ring::default(),
                open: Vec::new(),
                sealed_through: 0,
                bytes: 0,
                buffers: 0,
                next_seq: 1,
                boundary: 0,
                evicted_through: 0,
                released_through: 0,
                total: 0,
                readers: Readers::default(),
                next_reader: 0,
                cut: HashSet::new(),
            }),
            latest: watch::Sender::new(0),
            advanced: Notify::new(),
            meter,
        }
    }

    /// Registers a reader positioned after `cursor`: frames after it are kept for it.
    /// [`Gap`] when some of them are already gone (or `cursor` is in the future).
    pub fn register(&self, cursor: u64) -> Result<ReaderSlot, Gap> {
        let mut inner = self.lock();
        if cursor < inner.evicted_through || cursor >= inner.next_seq {
            return Err(Gap);
        }
        let id = inner.next_reader;
        inner.next_reader += 1;
        inner.readers.insert((cursor, id), None);
        Ok(ReaderSlot { id, cursor })
    }

    /// Moves a registered reader to `cursor` (it has taken every frame up to it); [`Cut`]
    /// when it was cut for stalling meanwhile.
    pub fn advance(&self, slot: &mut ReaderSlot, cursor: u64) -> Result<(), Cut> {
        {
            let mut inner = self.lock();
            if inner.cut.remove(&slot.id) {
                return Err(Cut);
            }
            if cursor == slot.cursor {
                return Ok(());
            }
            // The writer only ever waits on a full window.
            let was_full = inner.window_full(&self.limits);
            inner.readers.remove(&(slot.cursor, slot.id));
            inner.readers.insert((cursor, slot.id), None);
            slot.cursor = cursor;
            self.drop_released_for(&mut inner);
            if !was_full {
                return Ok(());
            }
        }
        self.advanced.notify_waiters();
        Ok(())
    }

    /// Ends a registration.
    pub fn unregister(&self, slot: ReaderSlot) {
        {
            let mut inner = self.lock();
            inner.readers.remove(&(slot.cursor, slot.id));
            inner.cut.remove(&slot.id);
            self.drop_released_for(&mut inner);
        }
        self.advanced.notify_waiters();
    }

    /// Cuts every registered reader that has had frames to take and taken none of them for
    /// `stall`, as seen by successive calls (`now_ms` is the caller's clock): the first
    /// call that finds a reader behind notes the time; a later one cuts it if it is still
    /// at the same cursor. Its frames are no longer kept for it, the writer may go on, and
    /// its next [`Journal::advance`] says [`Cut`]. Returns how many were cut.
    pub fn cut_stalled(&self, now_ms: u64, stall: std::time::Duration) -> usize {
        let stall_ms = stall.as_millis() as u64;
        let mut inner = self.lock();
        // Behind is behind what a reader can take: a batch not yet sealed is not counted.
        let last = inner.sealed_through;
        let mut stalled = Vec::new();
        for ((cursor, id), behind_since) in inner.readers.below_mut((last, 0)) {
            debug_assert!(cursor < last);
            match behind_since {
                None => *behind_since = Some(now_ms),
                Some(since) if now_ms.saturating_sub(*since) >= stall_ms => {
                    stalled.push((cursor, id));
                }
                Some(_) => {}
            }
        }
        for key in &stalled {
            inner.readers.remove(key);
            inner.cut.insert(key.1);
        }
        drop(inner);
        if !stalled.is_empty() {
            self.advanced.notify_waiters();
        }
        stalled.len()
    }

    /// Whether any reader is registered.
    pub fn has_readers(&self) -> bool {
        !self.lock().readers.is_empty()
    }

    /// Waits until the slowest registered reader is less than a window behind (at once
    /// when no reader is registered). The writer calls it before each item it journals.
    pub async fn room(&self) {
        loop {
            let advanced = self.advanced.notified();
            if !self.lock().window_full(&self.limits) {
                return;
            }
            self.publish();
            advanced.await;
        }
    }

    /// Releases every frame journaled so far (a finished run's frames, once nobody can
    /// still be catching up on them): those no registered reader needs go now, the others
    /// as their readers take them. A later cursor into them is a [`Gap`], answered by a
    /// resync. Returns the bytes freed now.
    pub fn release(&self) -> usize {
        let mut inner = self.lock();
        let before = inner.held();
        inner.released_through = inner.next_seq - 1;
        inner.drop_released();
        inner.frames.shrink_to_fit();
        let freed = before - inner.held();
        self.meter.sub(freed);
        freed
    }

    /// Takes the released frames a reader has just stopped needing off the meter (see
    /// [`Inner::drop_released`]).
    fn drop_released_for(&self, inner: &mut Inner) {
        let freed = inner.drop_released();
        if freed > 0 {
            self.meter.sub(freed);
        }
    }

    /// What the retained frames cost in memory.
    pub fn retained_bytes(&self) -> usize {
        self.lock().held()
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Encodes and appends one event; returns its id.
    pub fn push(&self, event: &Event, timestamp_ms: u64) -> EventId {
        self.push_all(std::slice::from_ref(event), timestamp_ms)
            .unwrap_or_else(|| self.id(self.last_seq()))
    }

    /// Encodes and appends `events` in order, waking readers once; returns the id of the
    /// last one (`None` when `events` is empty).
    pub fn push_all(&self, events: &[Event], timestamp_ms: u64) -> Option<EventId> {
        let last = self.append(events, timestamp_ms, true)?;
        self.latest.send_replace(last.seq);
        Some(last)
    }

    /// [`Journal::push_all`] without waking readers: the writer appends a batch and then
    /// calls [`Journal::publish`] once. The batch's frames are one block, handed to readers
    /// once published. (Readers waiting on [`Journal::room`] are never left waiting on
    /// unpublished frames: `room` publishes before it waits.)
    pub fn push_all_quietly(&self, events: &[Event], timestamp_ms: u64) -> Option<EventId> {
        self.append(events, timestamp_ms, false)
    }

    /// Wakes readers for everything appended so far.
    pub fn publish(&self) {
        let last = {
            let mut inner = self.lock();
            let before = inner.held();
            inner.seal();
            self.meter.replace(before, inner.held());
            inner.next_seq - 1
        };
        self.latest.send_if_modified(|latest| {
            let changed = *latest != last;
            *latest = last;
            changed
        });
    }

    /// Whether the writer may append without waiting (see [`Journal::room`]).
    pub fn has_room(&self) -> bool {
        !self.lock().window_full(&self.limits)
    }

    /// Encodes `events` into the open block and appends their frames; `seal` hands them to
    /// readers now (else [`Journal::publish`] does).
    fn append(&self, events: &[Event], timestamp_ms: u64, seal: bool) -> Option<EventId> {
        if events.is_empty() {
            return None;
        }
        let mut inner = self.lock();
        let before = inner.held();
        let mut id_buf = IdBuf::default();
        for event in events {
            if inner.open.len() >= BLOCK_BYTES {
                inner.seal();
            }
            if inner.open.capacity() == 0 {
                inner.open = spare::take();
            }
            let seq = inner.next_seq;
            inner.next_seq += 1;
            let id = self.id(seq);
            let id = id.encode(&mut id_buf);
            let start = inner.open.len();
            frame_into(&mut inner.open, id, event, Some(timestamp_ms));
            let end = inner.open.len();
            let legacy = Profile::Legacy
                .adapt(event)
                .map(|adapted| Box::new(event_frame(id, &adapted, Some(timestamp_ms))));
            let frame = Frame {
                seq,
                block: Bytes::new(),
                start,
                end,
                legacy,
                ends_segment: event.is_terminal(),
                starts_segment: matches!(event, Event::RunStarted { .. }),
                offset: inner.total,
            };
            if frame.ends_segment {
                inner.boundary = seq;
            }
            inner.bytes += frame.size();
            inner.buffers += frame.buffers();
            inner.total += frame.size() as u64;
            inner.frames.push_back(frame);
            // Over the bounds, the oldest frames go, but never one a registered reader
            // still needs (the writer waits for room instead, see `room`).
            let needed_from = inner.needed_from();
            while (inner.frames.len() > self.limits.max_frames
                || (inner.bytes > self.limits.max_bytes && inner.frames.len() > 1))
                && inner.frames.front().is_some_and(|f| f.seq < needed_from)
            {
                inner.evict_oldest();
            }
        }
        if seal {
            inner.seal();
        }
        let last = inner.next_seq - 1;
        let after = inner.held();
        self.meter.replace(before, after);
        drop(inner);
        Some(self.id(last))
    }

    /// The id of the frame with sequence `seq` in this journal.
    pub fn id(&self, seq: u64) -> EventId {
        EventId {
            epoch: self.epoch,
            tag: self.tag,
            seq,
        }
    }

    /// Encodes an event as a frame carrying the id of position `seq` without appending it
    /// (resync preambles: a client that reconnects with that id resumes right after `seq`).
    pub fn frame_at(&self, seq: u64, event: &Event, timestamp_ms: u64, profile: Profile) -> Bytes {
        let adapted = profile.adapt(event);
        let event = adapted.as_ref().unwrap_or(event);
        event_frame(
            self.id(seq).encode(&mut IdBuf::default()),
            event,
            Some(timestamp_ms),
        )
    }

    /// The sequence of the newest frame (0 when empty).
    pub fn last_seq(&self) -> u64 {
        self.lock().next_seq - 1
    }

    /// The sequence of the newest frame that ends a segment (0 before the first): a stream
    /// that resumes after it sees whole segments only, so what is framed outside the
    /// journal (a refusal, a hydration) carries its id.
    pub fn boundary(&self) -> u64 {
        self.lock().boundary
    }

    /// The sequence number the next frame will get.
    pub fn next_seq(&self) -> u64 {
        self.lock().next_seq
    }

    /// Every retained frame strictly after `after` (a sequence number of this journal), or
    /// [`Gap`] when some of them were evicted.
    pub fn replay_after(&self, after: u64) -> Result<Vec<Frame>, Gap> {
        let mut frames = VecDeque::new();
        self.replay_into(after, &mut frames)?;
        Ok(frames.into())
    }

    /// Appends every retained frame strictly after `after` to `out` (sharing their bytes);
    /// how many, or [`Gap`] when some of them were evicted.
    pub fn replay_into(&self, after: u64, out: &mut VecDeque<Frame>) -> Result<usize, Gap> {
        let inner = self.lock();
        if after < inner.evicted_through || after >= inner.next_seq {
            return Err(Gap);
        }
        let start = inner.index_of(after + 1);
        let end = inner.index_of(inner.sealed_through + 1);
        if start >= end {
            return Ok(0);
        }
        out.reserve(end - start);
        out.extend(inner.frames.range(start, end).cloned());
        Ok(end - start)
    }

    /// Resolves a client-supplied id to a cursor in this journal, or [`Gap`] when it cannot
    /// be honoured (another boot, evicted, or in the future).
    pub fn cursor_for(&self, id: EventId) -> Result<u64, Gap> {
        if id.epoch != self.epoch || id.tag != self.tag {
            return Err(Gap);
        }
        let inner = self.lock();
        if id.seq < inner.evicted_through || id.seq >= inner.next_seq {
            return Err(Gap);
        }
        Ok(id.seq)
    }

    /// A receiver that changes whenever a frame is appended.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock means a panic while appending; the ring itself is still
        // consistent (every mutation above is completed before any call that can panic).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        self.meter.sub(inner.held());
    }
}

#[cfg(test)]
mod tests;
