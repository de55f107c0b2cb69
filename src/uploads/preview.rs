//! Links that show an upload with no token: what a page's `<img>` loads, since it cannot
//! send a bearer header. A link is the upload's URL with a query of three parameters:
//! `owner` (the name of the owner's upload directory, a hash of the principal), `expires`
//! (seconds since the Unix epoch) and `signature`, the lowercase hex HMAC-SHA256 of the
//! three values under a key the daemon draws at start and never writes down. A link
//! shows one upload, only to be read, until it expires; a restart ends every link, and
//! whatever shows a thread again (a snapshot, its messages) signs fresh ones.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Why a link was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PreviewError {
    #[error("the link is not an upload's link: it needs owner, expires and signature")]
    Malformed,
    #[error("the link has expired; show the thread again for a fresh one")]
    Expired,
    #[error("the link's signature does not match it")]
    Mismatch,
}

/// The key links are signed with.
pub(super) struct PreviewKey([u8; 32]);

impl fmt::Debug for PreviewKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PreviewKey([redacted])")
    }
}

impl PreviewKey {
    /// A key of the OS's random bytes.
    pub(super) fn random() -> PreviewKey {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).expect("the OS random generator");
        PreviewKey(key)
    }

    fn mac(&self, owner: &str, id: &str, expires: u64) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        // Each value is of a fixed alphabet without NUL: the separators keep them apart.
        for part in [owner, id, &expires.to_string()] {
            mac.update(part.as_bytes());
            mac.update(b"\0");
        }
        mac
    }

    /// The query of the link to upload `id` in directory `owner`, good until `expires`.
    pub(super) fn query(&self, owner: &str, id: &str, expires: u64) -> String {
        let code = self.mac(owner, id, expires).finalize().into_bytes();
        format!(
            "owner={owner}&expires={expires}&signature={}",
            crate::hex::encode(&code)
        )
    }

    /// The owner directory a link's `query` to upload `id` names, when the link is whole,
    /// signed with this key and not expired at `now` (seconds since the epoch).
    pub(super) fn check(&self, id: &str, query: &str, now: u64) -> Result<String, PreviewError> {
        let (mut owner, mut expires, mut signature) = (None, None, None);
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match &*key {
                "owner" => &mut owner,
                "expires" => &mut expires,
                "signature" => &mut signature,
                _ => continue,
            };
            if slot.replace(value.into_owned()).is_some() {
                return Err(PreviewError::Malformed);
            }
        }
        let (Some(owner), Some(expires), Some(signature)) = (owner, expires, signature) else {
            return Err(PreviewError::Malformed);
        };
        let expires: u64 = expires.parse().map_err(|_| PreviewError::Malformed)?;
        let code = crate::hex::decode(&signature).ok_or(PreviewError::Malformed)?;
        if owner.len() != 32 || !owner.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(PreviewError::Malformed);
        }
        // In constant time: the code is what a forger would guess at.
        self.mac(&owner, id, expires)
            .verify_slice(&code)
            .map_err(|_| PreviewError::Mismatch)?;
        if expires < now {
            return Err(PreviewError::Expired);
        }
        Ok(owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "0123456789abcdef0123456789abcdef";
    const ID: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn a_link_holds_until_it_expires_and_only_for_its_upload() {
        let key = PreviewKey::random();
        let query = key.query(OWNER, ID, 1_000);
        assert_eq!(key.check(ID, &query, 999).as_deref(), Ok(OWNER));
        assert_eq!(key.check(ID, &query, 1_000).as_deref(), Ok(OWNER));
        assert_eq!(key.check(ID, &query, 1_001), Err(PreviewError::Expired));
        let other = "00000000000000000000000000000000";
        assert_eq!(key.check(other, &query, 0), Err(PreviewError::Mismatch));
        let later = query.replace("expires=1000", "expires=99999");
        assert_eq!(key.check(ID, &later, 0), Err(PreviewError::Mismatch));
        let moved = query.replace(OWNER, other);
        assert_eq!(key.check(ID, &moved, 0), Err(PreviewError::Mismatch));
        // Another daemon's key (or this one's after a restart) signs other links.
        assert_eq!(
            PreviewKey::random().check(ID, &query, 0),
            Err(PreviewError::Mismatch)
        );
    }

    #[test]
    fn a_link_missing_a_part_or_naming_one_twice_is_malformed() {
        let key = PreviewKey::random();
        let query = key.query(OWNER, ID, 1_000);
        for bad in [
            String::new(),
            "owner=x&expires=1&signature=00".to_owned(),
            query.replace("signature=", "signature=zz"),
            query.replace("expires=1000", "expires=-1"),
            format!("{query}&expires=1000"),
            query
                .split("&signature")
                .next()
                .unwrap_or_default()
                .to_owned(),
        ] {
            assert_eq!(
                key.check(ID, &bad, 0),
                Err(PreviewError::Malformed),
                "{bad}"
            );
        }
        // Other parameters (a cache-buster) are ignored.
        assert!(key.check(ID, &format!("{query}&v=2"), 0).is_ok());
    }

    #[test]
    fn the_key_is_never_printed() {
        assert_eq!(
            format!("{:?}", PreviewKey([7; 32])),
            "PreviewKey([redacted])"
        );
    }
}
