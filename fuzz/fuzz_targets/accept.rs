//! `Accept` negotiation: never panics, and is decided by the header alone (the same value
//! always gets the same answer; surrounding whitespace never changes it).
#![no_main]

use agui_serve::protocol::negotiate;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|accept: &str| {
    let answer = negotiate(Some(accept));
    assert_eq!(negotiate(Some(accept)), answer);
    assert_eq!(
        negotiate(Some(&format!("  {accept}  "))),
        answer,
        "{accept:?}"
    );
});
