//! A stream attached to a thread's journal: what an HTTP response body reads from.
//!
//! An [`Attachment`] yields encoded SSE frames strictly after its cursor, then waits for new
//! ones, sending a keep-alive comment after a period of silence. It ends after the segment's
//! terminal frame, when it falls out of the journal's window (it is cut, never silently
//! skipped), or when the server stops streams. Dropping it detaches from the run, which arms
//! the disconnect grace once nobody is attached.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use super::LiveRun;
use super::journal::{Cut, Frame, Journal, ReaderSlot};
use crate::metrics::{CutReason, ReattachKind, StreamGuard};
use crate::protocol::{Event, KEEP_ALIVE, Profile};

/// What a stream reads of its thread: its journal, its id, and whether it has left memory.
/// A stream holds nothing else of the thread (its transcript and state are freed with it).
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub(crate) journal: Arc<Journal>,
    pub(crate) id: String,
    /// Set when the thread object left memory (deleted, evicted, its lease lost).
    pub(crate) retired: Arc<std::sync::atomic::AtomicBool>,
}

/// Frames a reader takes between reports of its progress within one batch.
const TELL_EVERY: usize = 64;

/// At most this many bytes of frames go out as one chunk (see [`Attachment::with_ready`]).
const BATCH_BYTES: usize = 16 * 1024;

/// Whether a reattach replays exactly or had to resynchronise (`agui-resume` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    Exact,
    Resync,
}

impl Resume {
    pub fn as_str(self) -> &'static str {
        match self {
            Resume::Exact => "exact",
            Resume::Resync => "resync",
        }
    }
}

/// When an attachment's stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// After the first terminal frame (a `POST` follows its own segment).
    Segment,
    /// [`Mode::Segment`] for the first segment that starts after the cursor (an answer's
    /// `POST`: the segment the answer opens; the suspended segment's terminal frame may
    /// still be on its way when the stream attaches).
    NextSegment,
    /// After a terminal frame with nothing journaled after it (reattach: catches up over
    /// any number of segments, then follows live).
    Follow,
    /// After the preamble (hydration); the journal is not read.
    Preamble,
    /// Never with a run: every run of the thread from here on (`?follow=all`); the stream
    /// ends only when the client leaves, it is cut, or the server stops.
    EveryRun,
}

/// One reader of one thread's journal.
pub struct Attachment {
    mode: Mode,
    thread: Source,
    cursor: u64,
    profile: Profile,
    latest: watch::Receiver<u64>,
    keep_alive: Duration,
    stop: CancellationToken,
    preamble: VecDeque<Bytes>,
    pending: VecDeque<Frame>,
    done: bool,
    resume: Resume,
    /// This reader's registered place in the journal (not for a preamble-only stream):
    /// the frames after it are kept until it has taken them.
    slot: Option<ReaderSlot>,
    /// Frames taken since the journal was last told.
    untold: usize,
    /// When frames last went out (the keep-alive counts silence from there), and the
    /// keep-alive timer.
    last_sent: Instant,
    silence: Pin<Box<Sleep>>,
    _guard: Option<AttachGuard>,
    /// Fires when the run this stream follows has ended with everything journaled (a
    /// `Follow` stream only): a stream that attached after the run's terminal frame has no
    /// terminal of its own to end on, and ends then instead of waiting for a next run.
    run_over: Option<CancellationToken>,
    /// A segment's `RUN_STARTED` went out on this stream and its terminal frame has not.
    open: bool,
    /// Counts this stream as open in the metrics, and its cut if it is cut.
    counted: Option<StreamGuard>,
    /// A queued input's stream before its run starts: it becomes the stream it is handed
    /// (the run's, or a refusal), sending keep-alives meanwhile.
    waiting: Option<tokio::sync::oneshot::Receiver<Attachment>>,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.thread.journal.unregister(slot);
        }
    }
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment")
            .field("thread", &self.thread.id)
            .field("cursor", &self.cursor)
            .field("profile", &self.profile)
            .finish_non_exhaustive()
    }
}

impl Attachment {
    /// The live run this stream follows, if any.
    pub(in crate::runtime) fn live_run(&self) -> Option<&Arc<LiveRun>> {
        self._guard.as_ref().map(|guard| &guard.run)
    }

    pub(super) fn new(
        thread: Source,
        cursor: u64,
        profile: Profile,
        mode: Mode,
        keep_alive: Duration,
        stop: CancellationToken,
        run: Option<Arc<LiveRun>>,
    ) -> Attachment {
        let latest = thread.journal.subscribe();
        // A cursor no longer retained is not registered: the first read finds the gap.
        let slot = (mode != Mode::Preamble)
            .then(|| thread.journal.register(cursor).ok())
            .flatten();
        Attachment {
            mode,
            thread,
            cursor,
            profile,
            latest,
            keep_alive,
            stop,
            preamble: VecDeque::new(),
            pending: VecDeque::new(),
            done: false,
            resume: Resume::Exact,
            slot,
            untold: 0,
            last_sent: Instant::now(),
            silence: Box::pin(tokio::time::sleep(keep_alive)),
            run_over: run
                .as_ref()
                .filter(|_| mode == Mode::Follow)
                .map(|run| run.finished.clone()),
            open: false,
            _guard: run.map(AttachGuard::new),
            counted: None,
            waiting: None,
        }
    }

    /// This stream, then every later run of the thread: it does not end with a run. After
    /// a hydration preamble (which stands for everything journaled so far) it reads on from
    /// the journal's end.
    pub(super) fn following_every_run(mut self) -> Attachment {
        if self.mode == Mode::Preamble {
            self.cursor = self.thread.journal.last_seq();
            self.slot = self.thread.journal.register(self.cursor).ok();
        }
        self.mode = Mode::EveryRun;
        self.run_over = None;
        self
    }

    /// A queued input's stream still waiting for its run.
    pub(crate) fn is_queued(&self) -> bool {
        self.waiting.is_some()
    }

    /// This stream waits for the attachment `started` hands over, then is that one.
    pub(super) fn waiting_for(
        mut self,
        started: tokio::sync::oneshot::Receiver<Attachment>,
    ) -> Attachment {
        self.waiting = Some(started);
        self
    }

    /// Waits for a queued input's run (keep-alives meanwhile) and becomes its stream;
    /// `false` when the stream ends instead (the server stops, or nothing will start).
    async fn wait_for_start(&mut self) -> Result<(), Option<Bytes>> {
        let Some(started) = self.waiting.as_mut() else {
            return Ok(());
        };
        tokio::select! {
            biased;
            handed = started => match handed {
                Ok(attachment) => {
                    *self = attachment;
                    Ok(())
                }
                Err(_) => Err(self.end()),
            },
            () = self.stop.cancelled() => Err(self.end()),
            () = self.silence.as_mut() => {
                self.last_sent = Instant::now();
                self.silence.as_mut().reset(self.last_sent + self.keep_alive);
                Err(Some(Bytes::from_static(KEEP_ALIVE)))
            }
        }
    }

    /// Frames sent before anything from the journal (a resync or hydration preamble).
    pub(super) fn with_preamble(mut self, preamble: Vec<Bytes>, resume: Resume) -> Attachment {
        // A resync preamble opens the live segment, which the journal then continues; a
        // preamble-only stream is a whole run of its own.
        self.open = self.mode != Mode::Preamble && !preamble.is_empty();
        self.preamble = preamble.into();
        self.resume = resume;
        self
    }

    /// Counts the stream in the metrics while it lives.
    pub(super) fn counted(mut self, guard: StreamGuard) -> Attachment {
        self.counted = Some(guard);
        self
    }

    /// The stream ends early for `reason`.
    fn cut(&self, reason: CutReason) {
        if let Some(counted) = &self.counted {
            counted.cut(reason);
        }
    }

    pub(super) fn with_resume(mut self, resume: Resume) -> Attachment {
        self.resume = resume;
        self
    }

    /// Whether the journal keeps the frames after this reader's cursor for it.
    pub(super) fn is_registered(&self) -> bool {
        self.slot.is_some()
    }

    pub fn resume(&self) -> Resume {
        self.resume
    }

    /// How a reattach was answered: a snapshot run that ends by itself, else by its
    /// `agui-resume`.
    pub(super) fn kind(&self) -> ReattachKind {
        match (self.mode, self.resume) {
            (Mode::Preamble, _) => ReattachKind::Hydration,
            (_, Resume::Exact) => ReattachKind::Exact,
            (_, Resume::Resync) => ReattachKind::Resync,
        }
    }

    pub fn thread_id(&self) -> &str {
        &self.thread.id
    }

    /// Ends the stream: nothing more is read, and the journal no longer keeps frames for
    /// this reader.
    fn end(&mut self) -> Option<Bytes> {
        self.done = true;
        if let Some(slot) = self.slot.take() {
            self.thread.journal.unregister(slot);
        }
        None
    }

    /// Tells the journal this reader has taken everything up to its cursor; [`Cut`] when
    /// it was cut for stalling.
    fn tell_progress(&mut self) -> Result<(), Cut> {
        self.untold = 0;
        let Some(slot) = self.slot.as_mut() else {
            return Ok(());
        };
        self.thread
            .journal
            .advance(slot, self.cursor)
            .inspect_err(|_| {
                if let Some(counted) = &self.counted {
                    counted.cut(CutReason::Stall);
                }
                tracing::warn!(
                    thread.id = %self.thread.id,
                    cursor = self.cursor,
                    "stream stopped draining; cut so it can reattach"
                );
            })
    }

    /// `RUN_ERROR{code:"SHUTDOWN"}`. Not journaled, so it carries the id of the journal's
    /// last segment boundary, like every frame made outside the journal.
    fn shutdown_terminal(&mut self) -> Bytes {
        self.open = false;
        let event = Event::RunError {
            message: "the server is shutting down".to_owned(),
            code: Some("SHUTDOWN".to_owned()),
            usage: None,
        };
        self.thread.journal.frame_at(
            self.thread.journal.boundary(),
            &event,
            crate::clock::now_ms(),
            self.profile,
        )
    }

    /// Takes one pending frame: moves the cursor past it and says what to do with it.
    fn take(&mut self, frame: &Frame) -> Taken {
        self.cursor = frame.seq;
        if self.mode == Mode::NextSegment {
            if !frame.starts_segment {
                return Taken::Skip;
            }
            self.mode = Mode::Segment;
        }
        // Within a long batch, progress is reported now and then, so the stall check sees
        // a reader that is taking frames as one.
        self.untold += 1;
        if self.untold >= TELL_EVERY && self.tell_progress().is_err() {
            return Taken::Cut;
        }
        self.open = (self.open || frame.starts_segment) && !frame.ends_segment;
        if frame.ends_segment {
            self.done = match self.mode {
                Mode::Segment | Mode::NextSegment | Mode::Preamble => true,
                Mode::Follow => {
                    self.pending.is_empty() && self.thread.journal.last_seq() <= frame.seq
                }
                Mode::EveryRun => false,
            };
        }
        Taken::Send
    }

    /// `first`, and the frames already pending after it (up to [`BATCH_BYTES`], and not
    /// past a terminal frame), as one chunk: one write for the lot, where hyper wrote at
    /// most 16 frames per write (the kernel's cost per write was a quarter of the daemon's
    /// CPU under load). While the frames follow each other in one block of the journal the
    /// chunk is a slice of that block, without a copy; past it they are copied into one
    /// buffer. The bytes are the same.
    fn with_ready(&mut self, first: Bytes) -> Bytes {
        if self.done {
            return first;
        }
        let mut chunk = first;
        let mut copied: Option<BytesMut> = None;
        while let Some(frame) = self.pending.front() {
            let len = copied.as_ref().map_or(chunk.len(), BytesMut::len);
            if len + frame.len(self.profile) > BATCH_BYTES {
                break;
            }
            let longer = match &copied {
                None => frame.continues(&chunk, self.profile),
                Some(_) => None,
            };
            let Some(frame) = self.pending.pop_front() else {
                break;
            };
            match self.take(&frame) {
                Taken::Send => match longer {
                    Some(longer) => chunk = longer,
                    None => copied
                        .get_or_insert_with(|| {
                            let ready = frame.len(self.profile) + self.ready_len(len);
                            let mut buffer = BytesMut::with_capacity(len + ready);
                            buffer.extend_from_slice(&chunk);
                            buffer
                        })
                        .extend_from_slice(frame.data(self.profile)),
                },
                // Not for this stream: the chunk ends before it.
                Taken::Skip => break,
                Taken::Cut => {
                    // Cut for stalling: what is taken goes out, then the stream ends.
                    self.done = true;
                    break;
                }
            }
            if self.done || frame.ends_segment {
                break;
            }
        }
        copied.map_or(chunk, BytesMut::freeze)
    }

    /// Bytes of the pending frames that fit in a chunk already `len` long (see
    /// [`Attachment::with_ready`]).
    fn ready_len(&self, mut len: usize) -> usize {
        let start = len;
        for frame in &self.pending {
            let next = frame.len(self.profile);
            if len + next > BATCH_BYTES {
                break;
            }
            len += next;
            if frame.ends_segment {
                break;
            }
        }
        len - start
    }

    /// The next chunk of the response body: [`Attachment::next`], with the frames already
    /// pending after it (see [`Attachment::with_ready`]).
    pub async fn next_chunk(&mut self) -> Option<Bytes> {
        let first = self.next().await?;
        Some(self.with_ready(first))
    }

    /// Stopping: everything journaled has been delivered. A segment still open here (its
    /// run did not end within the shutdown grace) is closed with the terminal event its
    /// run would have written, so the stream never ends as if it were complete.
    fn end_stopping(&mut self) -> Option<Bytes> {
        self.cut(CutReason::Shutdown);
        let terminal = self.open.then(|| self.shutdown_terminal());
        self.end();
        terminal
    }

    /// The stream fell behind the journal's window: it is cut, so the client reattaches.
    fn end_behind(&mut self) -> Option<Bytes> {
        self.cut(CutReason::Gap);
        tracing::warn!(
            thread.id = %self.thread.id,
            cursor = self.cursor,
            "stream fell behind the journal window; cut so it can reattach"
        );
        self.end()
    }

    /// The next frame (or keep-alive comment), or `None` when the stream is over.
    pub async fn next(&mut self) -> Option<Bytes> {
        while self.waiting.is_some() {
            match self.wait_for_start().await {
                Ok(()) => {}
                Err(bytes) => return bytes,
            }
        }
        loop {
            if let Some(bytes) = self.preamble.pop_front() {
                return Some(bytes);
            }
            if self.done || self.mode == Mode::Preamble {
                return self.end();
            }
            if let Some(frame) = self.pending.pop_front() {
                match self.take(&frame) {
                    Taken::Send => return Some(frame.bytes(self.profile)),
                    Taken::Skip => continue,
                    Taken::Cut => return self.end(),
                }
            }
            // Everything up to the cursor has gone out: the journal may let go of it.
            if self.tell_progress().is_err() {
                return self.end();
            }
            // Mark the current value seen before reading so no append is missed.
            self.latest.borrow_and_update();
            match self
                .thread
                .journal
                .replay_into(self.cursor, &mut self.pending)
            {
                Ok(taken) if taken > 0 => {
                    self.last_sent = Instant::now();
                    continue;
                }
                Ok(_) if !self.open && self.run_over.as_ref().is_some_and(|f| f.is_cancelled()) => {
                    // The followed run is over, all it wrote has gone out, and no later
                    // segment is open on this stream.
                    return self.end();
                }
                Ok(_) if self.stop.is_cancelled() => return self.end_stopping(),
                Ok(_) => {}
                Err(_gap) => return self.end_behind(),
            }
            // Caught up: the queue of frames read ahead is let go while the stream waits
            // (an idle stream holds none; a busy one makes it again per batch it reads).
            if self.pending.capacity() > 0 {
                self.pending = VecDeque::new();
            }
            let run_over = self.run_over.clone().filter(|_| !self.open);
            tokio::select! {
                biased;
                () = async {
                    match &run_over {
                        Some(over) => over.cancelled().await,
                        None => std::future::pending().await,
                    }
                }, if run_over.is_some() => {}
                changed = self.latest.changed() => {
                    if changed.is_err() {
                        return self.end();
                    }
                }
                // Stopping ends the stream only once what is journaled has gone out (the
                // loop re-reads the journal first).
                () = self.stop.cancelled() => {}
                () = self.silence.as_mut() => {
                    // One timer per stream, re-armed only when it fires: after a frame
                    // went out meanwhile, it waits out the rest of the silence.
                    let due = self.last_sent + self.keep_alive;
                    if due > Instant::now() {
                        self.silence.as_mut().reset(due);
                        continue;
                    }
                    // A stream of every run ends once its thread has left memory (deleted,
                    // or its lease lost): later runs go to another thread object, which
                    // the client reaches by attaching again.
                    if self.mode == Mode::EveryRun
                        && !self.open
                        && self.thread.retired.load(std::sync::atomic::Ordering::SeqCst)
                    {
                        return self.end();
                    }
                    self.last_sent = Instant::now();
                    self.silence.as_mut().reset(self.last_sent + self.keep_alive);
                    return Some(Bytes::from_static(KEEP_ALIVE));
                }
            }
        }
    }
}

/// What [`Attachment::take`] makes of a pending frame.
enum Taken {
    /// Goes out.
    Send,
    /// Not for this stream (before the segment an answer's stream follows).
    Skip,
    /// The reader was cut for stalling: the stream ends.
    Cut,
}

/// Counts a stream as attached to a run for as long as it lives.
struct AttachGuard {
    run: Arc<LiveRun>,
}

impl AttachGuard {
    fn new(run: Arc<LiveRun>) -> AttachGuard {
        run.attach();
        AttachGuard { run }
    }
}

impl Drop for AttachGuard {
    fn drop(&mut self) {
        self.run.detach();
    }
}
