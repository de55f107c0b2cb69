//! `Accept` negotiation: never panics, and is decided by the header alone (the same value
//! always gets the same answer; surrounding whitespace never changes it).
#![no_main]

use agui_serve::protocol::{Offer, negotiate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|accept: &str| {
    for offer in [Offer::EventStream, Offer::EventStreamOrProtobuf] {
        let answer = negotiate(Some(accept), offer);
        assert_eq!(negotiate(Some(accept), offer), answer);
        assert_eq!(
            negotiate(Some(&format!("  {accept}  ")), offer),
            answer,
            "{accept:?}"
        );
    }
});
