//! The journal's tests: replay, gaps, readers, backpressure.
use super::*;

fn text(n: usize) -> Event {
    Event::TextMessageContent {
        message_id: "m".into(),
        delta: "x".repeat(n),
        subagent_run_id: None,
    }
}

#[test]
fn ids_round_trip_and_reject_garbage() {
    let id = EventId {
        epoch: 0x18f3a,
        tag: 0xdead_beef,
        seq: 42,
    };
    assert_eq!(EventId::parse(&id.to_string()), Some(id));
    for id in [
        EventId {
            epoch: 0,
            tag: 0,
            seq: 0,
        },
        EventId {
            epoch: u64::MAX,
            tag: u32::MAX,
            seq: u64::MAX,
        },
        EventId {
            epoch: 0x18f3a,
            tag: 7,
            seq: 0x1_0000_0000,
        },
    ] {
        let old_style = format!("{:x}-{:08x}-{:08x}", id.epoch, id.tag, id.seq);
        assert_eq!(id.to_string(), old_style);
        assert_eq!(EventId::parse(&old_style), Some(id));
    }
    for bad in [
        "",
        "-",
        "x-1-1",
        "1--1",
        "1-zz-1",
        "12",
        "1-2",
        "1-2-3-4",
        "1-+2-3",
        "1-123456789-1",
    ] {
        assert_eq!(EventId::parse(bad), None, "{bad}");
    }
}

#[tokio::test]
async fn a_registered_reader_pins_its_frames_and_holds_the_writer_back() {
    use std::time::Duration;
    let j = Journal::new(
        7,
        JournalLimits {
            max_frames: 4,
            max_bytes: usize::MAX,
        },
    );
    let mut slot = j.register(0).expect("register");
    for _ in 0..6 {
        j.push(&text(1), 0);
    }
    // Beyond the bound, but the reader has taken none of them.
    assert_eq!(j.replay_after(0).expect("kept").len(), 6);
    let wait = Duration::from_millis(20);
    assert!(
        tokio::time::timeout(wait, j.room()).await.is_err(),
        "window full"
    );
    j.advance(&mut slot, 5).expect("not cut");
    tokio::time::timeout(Duration::from_secs(5), j.room())
        .await
        .expect("room once the reader advanced");
    // What the reader has taken can go now.
    j.push(&text(1), 0);
    assert_eq!(j.replay_after(0).err(), Some(Gap));
    assert_eq!(j.replay_after(5).expect("kept").len(), 2);
    // Released: nothing is kept, and a cursor into it is a gap.
    j.unregister(slot);
    j.release();
    assert_eq!(j.replay_after(6).err(), Some(Gap));
    assert!(j.register(6).is_err());
    assert!(j.replay_after(7).expect("at the end").is_empty());
}

#[tokio::test]
async fn a_reader_that_takes_nothing_for_the_stall_timeout_is_cut_and_frees_the_writer() {
    use std::time::Duration;
    let stall = Duration::from_millis(100);
    let j = Journal::new(
        7,
        JournalLimits {
            max_frames: 4,
            max_bytes: usize::MAX,
        },
    );
    let mut steady = j.register(0).expect("register");
    let mut stalled = j.register(0).expect("register");
    // Nothing to take yet: never stalled, however long.
    assert_eq!(j.cut_stalled(0, stall), 0);
    assert_eq!(j.cut_stalled(10_000, stall), 0);
    for _ in 0..4 {
        j.push(&text(1), 0);
    }
    // Both behind: noted at 20 000, not cut before the stall timeout has passed.
    assert_eq!(j.cut_stalled(20_000, stall), 0);
    assert_eq!(j.cut_stalled(20_050, stall), 0);
    // The steady one takes its frames: its note is cleared.
    j.advance(&mut steady, 4).expect("not cut");
    assert_eq!(j.cut_stalled(20_100, stall), 1, "only the stalled one");
    // The writer, held back by the stalled reader's full window, may go on.
    tokio::time::timeout(Duration::from_secs(5), j.room())
        .await
        .expect("room once the stalled reader is cut");
    // The stalled reader hears it at its next report, once.
    assert_eq!(j.advance(&mut stalled, 1), Err(Cut));
    j.unregister(stalled);
    j.push(&text(1), 0);
    assert_eq!(j.cut_stalled(30_000, stall), 0, "noted");
    assert_eq!(j.cut_stalled(30_099, stall), 0, "not yet");
    j.advance(&mut steady, 5).expect("steady is never cut");
    assert_eq!(j.cut_stalled(40_000, stall), 0);
    j.unregister(steady);
}

#[test]
fn replay_returns_exactly_the_frames_after() {
    let j = Journal::new(7, JournalLimits::default());
    for _ in 0..5 {
        j.push(&text(1), 0);
    }
    let seqs: Vec<u64> = j
        .replay_after(2)
        .expect("retained")
        .iter()
        .map(|f| f.seq)
        .collect();
    assert_eq!(seqs, [3, 4, 5]);
    assert!(j.replay_after(5).expect("retained").is_empty());
    assert_eq!(j.replay_after(0).expect("retained").len(), 5);
    assert_eq!(j.replay_after(6).err(), Some(Gap));
}

#[test]
fn eviction_by_count_is_a_gap() {
    let j = Journal::new(
        1,
        JournalLimits {
            max_frames: 3,
            max_bytes: usize::MAX,
        },
    );
    for _ in 0..5 {
        j.push(&text(1), 0);
    }
    assert_eq!(j.replay_after(1).err(), Some(Gap));
    assert_eq!(j.replay_after(2).expect("retained").len(), 3);
}

#[test]
fn eviction_by_bytes_is_a_gap() {
    let j = Journal::new(
        1,
        JournalLimits {
            max_frames: 100,
            max_bytes: 300,
        },
    );
    for _ in 0..5 {
        j.push(&text(100), 0);
    }
    assert!(j.replay_after(0).is_err());
    assert!(j.replay_after(4).is_ok());
}

#[test]
fn foreign_epoch_is_a_gap() {
    let j = Journal::new(2, JournalLimits::default());
    j.push(&text(1), 0);
    assert_eq!(
        j.cursor_for(EventId {
            epoch: 1,
            tag: j.tag,
            seq: 1
        }),
        Err(Gap)
    );
    assert_eq!(
        j.cursor_for(EventId {
            epoch: 2,
            tag: j.tag.wrapping_add(1),
            seq: 1
        }),
        Err(Gap)
    );
    assert_eq!(j.cursor_for(j.id(1)), Ok(1));
}

#[test]
fn frames_are_profile_specific_only_where_needed() {
    let j = Journal::new(1, JournalLimits::default());
    j.push(
        &Event::RunFinished {
            thread_id: "t".into(),
            run_id: "r".into(),
            result: None,
            outcome: Some(crate::protocol::Outcome::Cancelled),
            usage: None,
        },
        5,
    );
    let f = &j.replay_after(0).expect("retained")[0];
    assert!(f.ends_segment);
    let v1 = String::from_utf8(f.bytes(Profile::V1).to_vec()).expect("utf8");
    let legacy = String::from_utf8(f.bytes(Profile::Legacy).to_vec()).expect("utf8");
    assert!(v1.contains(r#""outcome":{"type":"cancelled"}"#), "{v1}");
    assert!(legacy.contains(r#""type":"RUN_ERROR""#), "{legacy}");
    assert!(legacy.contains(r#""code":"cancelled""#), "{legacy}");
}

#[test]
fn a_quiet_batch_is_one_block_handed_out_once_published() {
    let j = Journal::new(1, JournalLimits::default());
    j.push(&text(1), 5);
    let batch: Vec<Event> = (2..=4).map(text).collect();
    for event in &batch {
        j.push_all_quietly(std::slice::from_ref(event), 6);
    }
    // Positioned, but not handed out before the batch is published.
    assert_eq!(j.last_seq(), 4);
    assert_eq!(j.replay_after(1).expect("kept").len(), 0);
    j.publish();
    let frames = j.replay_after(0).expect("kept");
    assert_eq!(frames.len(), 4);
    // The bytes are each event's own frame, as encoded alone.
    for (frame, (seq, event)) in frames
        .iter()
        .zip((1..).zip(std::iter::once(text(1)).chain(batch.iter().cloned())))
    {
        let id = j.id(seq).to_string();
        let stamp = if seq == 1 { 5 } else { 6 };
        assert_eq!(
            frame.bytes(Profile::V1),
            event_frame(&id, &event, Some(stamp))
        );
    }
    // Frames of one block continue each other as one slice; across blocks they do not.
    let second = frames[1].bytes(Profile::V1);
    let both = frames[2]
        .continues(&second, Profile::V1)
        .expect("same block");
    assert_eq!(both.len(), second.len() + frames[2].len(Profile::V1));
    assert!(frames[3].continues(&both, Profile::V1).is_some());
    assert!(
        frames[1]
            .continues(&frames[0].bytes(Profile::V1), Profile::V1)
            .is_none()
    );
    assert!(frames[3].continues(&second, Profile::V1).is_none());
}

#[test]
fn a_block_is_sealed_at_its_bound_and_counted_while_open() {
    let meter = Arc::new(Meter::default());
    let j = Journal::metered(1, JournalLimits::default(), meter.clone());
    for _ in 0..40 {
        j.push_all_quietly(&[text(1000)], 1);
    }
    // Past the block's bound, the first frames were sealed without a publish.
    let early = j.replay_after(0).expect("kept");
    assert!(!early.is_empty() && early.len() < 40, "{}", early.len());
    assert_eq!(meter.get(), j.retained_bytes());
    j.publish();
    assert_eq!(j.replay_after(0).expect("kept").len(), 40);
    assert_eq!(meter.get(), j.retained_bytes());
    drop(j);
    assert_eq!(meter.get(), 0);
}

#[test]
fn released_frames_a_reader_is_still_taking_leave_as_it_takes_them() {
    let meter = Arc::new(Meter::default());
    let j = Journal::metered(1, JournalLimits::default(), meter.clone());
    for n in 1..=10 {
        j.push(&text(100 * n), 1);
    }
    let mut slot = j.register(4).expect("registered");
    // The run is over; its reader is still taking frames 5 to 10.
    j.release();
    assert_eq!(j.replay_after(4).expect("kept").len(), 6);
    assert_eq!(j.replay_after(3).err(), Some(Gap));
    let held = meter.get();
    assert_eq!(held, j.retained_bytes());
    // A next run's frames, journaled after the release, are not released with them.
    j.push(&text(5), 2);
    assert_eq!(j.advance(&mut slot, 7), Ok(()));
    assert_eq!(j.replay_after(7).expect("kept").len(), 4);
    assert_eq!(j.replay_after(6).err(), Some(Gap));
    // Frames 5 to 7 (about 2 kB) left; the next run's (about 100 bytes) came.
    assert!(meter.get() < held, "{} of {held}", meter.get());
    assert_eq!(meter.get(), j.retained_bytes());
    j.unregister(slot);
    let frames = j.replay_after(10).expect("the next run's frame is kept");
    assert_eq!(frames.len(), 1);
    assert_eq!(j.replay_after(9).err(), Some(Gap));
    assert_eq!(meter.get(), j.retained_bytes());
}

#[test]
fn a_later_push_hands_out_an_unpublished_batch_and_no_reader_stalls_on_one() {
    use std::time::Duration;
    let j = Journal::new(1, JournalLimits::default());
    j.push(&text(1), 1);
    let mut slot = j.register(1).expect("registered");
    j.push_all_quietly(&[text(2), text(3)], 2);
    // The reader has taken everything it can: a batch being written is not a stall.
    assert_eq!(j.cut_stalled(0, Duration::ZERO), 0);
    assert_eq!(j.cut_stalled(10, Duration::ZERO), 0);
    // A run's end written outside a batch (as after a panic in one) hands out the batch too.
    j.push(&text(4), 3);
    assert_eq!(j.replay_after(1).expect("kept").len(), 3);
    assert_eq!(j.advance(&mut slot, 4), Ok(()));
    j.unregister(slot);
}
