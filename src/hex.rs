//! Lowercase hex, the one encoding of random tokens and listing cursors.

/// `bytes` as lowercase hex, two digits a byte.
pub(crate) fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

/// The bytes of a hex string (either case); `None` when it is not whole bytes of hex.
pub(crate) fn decode(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    let value = |digit: u8| char::from(digit).to_digit(16);
    digits
        .chunks_exact(2)
        .map(|pair| Some((value(pair[0])? * 16 + value(pair[1])?) as u8))
        .collect()
}

/// The first 16 bytes of the SHA-256 of `bytes`, in lowercase hex: a name for a directory
/// that stands for `bytes` (any text) and is safe in a path.
pub(crate) fn short_hash(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    encode(&digest.as_ref()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_what_is_not_hex() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&bytes)), Some(bytes));
        assert_eq!(encode(b"\x00\xffa"), "00ff61");
        assert_eq!(decode("0A"), Some(vec![10]));
        for bad in ["0", "zz", "+1", "\u{e9}\u{e9}"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
