//! The event-id / `Last-Event-ID` parser: never panics, and an id it accepts prints back to
//! text that parses to the same id (so a client's cursor survives a round trip).
#![no_main]

use agui_serve::runtime::EventId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Some(id) = EventId::parse(text) {
        let printed = id.to_string();
        assert_eq!(
            EventId::parse(&printed),
            Some(id),
            "{text:?} -> {printed:?}"
        );
    }
});
