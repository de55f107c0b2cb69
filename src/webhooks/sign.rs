//! The signature every webhook POST carries: `agui-signature: t=UNIX,v1=HEX`, where HEX is
//! the lowercase hex HMAC-SHA256, keyed with the endpoint's secret, of the ASCII decimal
//! `t`, a `.`, and the body's exact bytes. `t` is the second the attempt was sent, so a
//! receiver can refuse an old message replayed (it checks `t` against its clock), and the
//! body cannot be changed without the signature failing. [`verify`] is the receiver's side,
//! used by the tests and shown in the documentation.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The header naming the event: the same on every attempt (the idempotency key).
pub const EVENT_ID_HEADER: &str = "agui-event-id";
/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "agui-signature";

type HmacSha256 = Hmac<Sha256>;

/// The MAC of `t + "." + body` under `secret`.
fn mac(secret: &[u8], t: u64, body: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length (a long one is hashed first).
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `agui-signature` value for `body` sent at `t` (seconds since the Unix epoch).
pub fn signature(secret: &[u8], t: u64, body: &[u8]) -> String {
    let code = mac(secret, t, body).finalize().into_bytes();
    format!("t={t},v1={}", crate::hex::encode(&code))
}

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the signature header is not `t=UNIX,v1=HEX`")]
    Malformed,
    #[error("the signature was made more than the tolerance away from now")]
    Stale,
    #[error("no v1 signature matches the body")]
    Mismatch,
}

/// Checks an `agui-signature` value against `body`: its `t` within `tolerance_s` of `now`
/// (seconds since the epoch), and one of its `v1` codes the MAC of `t.body` under
/// `secret`, compared in constant time. The signed `t` on success.
pub fn verify(
    secret: &[u8],
    header: &str,
    body: &[u8],
    now: u64,
    tolerance_s: u64,
) -> Result<u64, VerifyError> {
    let mut t = None;
    let mut codes = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => {
                t = Some(value.parse::<u64>().map_err(|_| VerifyError::Malformed)?);
            }
            Some(("v1", value)) => {
                codes.push(crate::hex::decode(value).ok_or(VerifyError::Malformed)?);
            }
            // Other schemes (a later version) are skipped.
            Some(_) => {}
            None => return Err(VerifyError::Malformed),
        }
    }
    let t = t.ok_or(VerifyError::Malformed)?;
    if codes.is_empty() {
        return Err(VerifyError::Malformed);
    }
    if now.abs_diff(t) > tolerance_s {
        return Err(VerifyError::Stale);
    }
    let matches = codes
        .iter()
        .any(|code| mac(secret, t, body).verify_slice(code).is_ok());
    if matches {
        Ok(t)
    } else {
        Err(VerifyError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_and_a_changed_body_time_or_secret_does_not() {
        let secret = b"whsec-0123456789abcdef0123456789";
        let body = br#"{"id":"e1","type":"run.finished"}"#;
        let header = signature(secret, 1_700_000_000, body);
        assert!(header.starts_with("t=1700000000,v1="), "{header}");
        assert_eq!(header.len(), "t=1700000000,v1=".len() + 64);
        assert_eq!(
            verify(secret, &header, body, 1_700_000_010, 300),
            Ok(1_700_000_000)
        );
        let tampered = br#"{"id":"e1","type":"run.failed"}"#;
        assert_eq!(
            verify(secret, &header, tampered, 1_700_000_010, 300),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify(b"another secret", &header, body, 1_700_000_010, 300),
            Err(VerifyError::Mismatch)
        );
        // The time is signed: moving it breaks the code.
        let moved = header.replace("t=1700000000", "t=1700000005");
        assert_eq!(
            verify(secret, &moved, body, 1_700_000_010, 300),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify(secret, &header, body, 1_700_001_000, 300),
            Err(VerifyError::Stale)
        );
        for bad in ["", "t=1", "v1=00", "t=x,v1=00", "t=1,v1=zz", "garbage"] {
            assert_eq!(
                verify(secret, bad, body, 1, 300),
                Err(VerifyError::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_code_is_the_one_openssl_computes() {
        // printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac 'whsec-0123456789abcdef0123456789'
        let header = signature(
            b"whsec-0123456789abcdef0123456789",
            1_700_000_000,
            br#"{"a":1}"#,
        );
        assert_eq!(
            header,
            "t=1700000000,v1=ad75a01384483800a111b071aa0da1f3f453a1296ba4406c4882bf40b78159f4"
        );
    }
}
