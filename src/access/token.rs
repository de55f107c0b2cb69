//! Bearer tokens: the master token, MCP endpoint secrets.

use std::fmt;

/// A bearer token. Its `Debug` and `Display` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl BearerToken {
    /// The shortest token accepted, in bytes.
    pub const MIN_LEN: usize = 16;

    /// Wraps a token value; rejects empty, short and whitespace-bearing values. A short
    /// token is guessed sooner, and the log scrubber, which replaces the token wherever
    /// it occurs, would mangle ordinary words that contain it.
    pub fn new(value: impl Into<String>) -> Result<BearerToken, TokenError> {
        let value = value.into();
        if value.is_empty() {
            return Err(TokenError::new("token is empty"));
        }
        if value.len() < Self::MIN_LEN {
            return Err(TokenError::new(format!(
                "token is {} bytes; at least {} are required (e.g. `openssl rand -hex 32`, \
                 or give no token and one is generated)",
                value.len(),
                Self::MIN_LEN
            )));
        }
        if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(TokenError::new("token contains whitespace"));
        }
        Ok(BearerToken(value))
    }

    /// A fresh random token: 32 bytes from the OS generator, hex encoded.
    pub fn generate() -> BearerToken {
        let mut bytes = [0u8; 32];
        // As `rand::random` would: without the OS generator there is no safe token.
        getrandom::fill(&mut bytes).expect("the OS random generator");
        BearerToken(crate::hex::encode(&bytes))
    }

    /// The secret itself. Call sites are few and reviewed: comparison and printing a
    /// generated token once.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

impl fmt::Display for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Why a token value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TokenError(String);

impl TokenError {
    fn new(message: impl Into<String>) -> TokenError {
        TokenError(message.into())
    }
}
