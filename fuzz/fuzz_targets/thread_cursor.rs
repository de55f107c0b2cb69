//! The thread-listing cursor: decoding never panics; a cursor that decodes encodes back to
//! one that decodes to the same position; and every position with an accepted id (at most
//! `MAX_ID_BYTES`) encodes to a cursor that is accepted back.
#![no_main]

use agui_serve::protocol::input::MAX_ID_BYTES;
use agui_serve::store::{decode_cursor, encode_cursor};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some((time, id)) = decode_cursor(text) {
            assert_eq!(decode_cursor(&encode_cursor(time, &id)), Some((time, id)));
        }
    }
    if data.len() >= 8 {
        let time = i64::from_le_bytes(data[..8].try_into().expect("eight bytes"));
        let id = String::from_utf8_lossy(&data[8..]);
        let mut end = id.len().min(MAX_ID_BYTES);
        while !id.is_char_boundary(end) {
            end -= 1;
        }
        let id = &id[..end];
        let cursor = encode_cursor(time, id);
        assert_eq!(
            decode_cursor(&cursor),
            Some((time, id.to_owned())),
            "a cursor the server made is accepted back"
        );
    }
});
