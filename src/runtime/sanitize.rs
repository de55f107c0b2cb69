//! Scrubs secrets from error text before it reaches a client or a log line.
//!
//! Removes: URL userinfo (`scheme://user:pass@host` -> `scheme://[redacted]@host`), the
//! value after `Bearer `, the value of `key=value` / `key: value` pairs whose key looks like
//! a credential (`password`, `secret`, `token`, `api_key`, ...), and any literal secret the
//! caller names (the daemon's own token).

const REDACTED: &str = "[redacted]";
const SECRET_KEYS: &[&str] = &[
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "api-key",
    "access_key",
    "authorization",
    "credential",
];
/// Longest message passed on; the rest is cut.
const MAX_LEN: usize = 2000;

/// Returns `text` with credentials removed and its length bounded.
pub fn sanitize(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_owned();
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        out = out.replace(secret, REDACTED);
    }
    out = redact_userinfo(&out);
    out = redact_bearer(&out);
    out = redact_pairs(&out);
    if out.len() > MAX_LEN {
        let mut cut = MAX_LEN;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match authority.rfind('@') {
            Some(at) => {
                out.push_str(REDACTED);
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    out
}

fn redact_bearer(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let lower = rest.to_ascii_lowercase();
        let Some(at) = lower.find("bearer ") else {
            break;
        };
        out.push_str(&rest[..at + 7]);
        let tail = &rest[at + 7..];
        let end = tail
            .find(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == ',')
            .unwrap_or(tail.len());
        if end > 0 {
            out.push_str(REDACTED);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

fn redact_pairs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let bytes = text.as_bytes();
    while i < text.len() {
        // A key is a run of [A-Za-z0-9_-] followed by `=` or `:` (optional spaces, quotes).
        if is_key_byte(bytes[i]) && (i == 0 || !is_key_byte(bytes[i - 1])) {
            let key_end = i + text[i..].bytes().take_while(|b| is_key_byte(*b)).count();
            let key = text[i..key_end].to_ascii_lowercase();
            let mut j = key_end;
            while j < text.len() && (bytes[j] == b'"' || bytes[j] == b'\'') {
                j += 1;
            }
            while j < text.len() && bytes[j] == b' ' {
                j += 1;
            }
            if j < text.len()
                && (bytes[j] == b'=' || bytes[j] == b':')
                && SECRET_KEYS.iter().any(|k| key.contains(k))
            {
                j += 1;
                while j < text.len() && (bytes[j] == b' ' || bytes[j] == b'"' || bytes[j] == b'\'')
                {
                    j += 1;
                }
                let value_end = j + text[j..]
                    .find(|c: char| {
                        c.is_whitespace() || matches!(c, '&' | ',' | ';' | '"' | '\'' | '}')
                    })
                    .unwrap_or(text.len() - j);
                out.push_str(&text[i..j]);
                if value_end > j {
                    out.push_str(REDACTED);
                }
                i = value_end;
                continue;
            }
            out.push_str(&text[i..key_end]);
            i = key_end;
            continue;
        }
        let ch = text[i..].chars().next().unwrap_or(' ');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

impl super::Runtime {
    /// `text` of an agent's, scrubbed as above of the daemon's own secrets too.
    pub(in crate::runtime) fn sanitized(&self, text: &str) -> String {
        let secrets: Vec<&str> = self.options().secrets.iter().map(String::as_str).collect();
        sanitize(text, &secrets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_removed() {
        assert_eq!(
            sanitize("connect postgres://app:hunter2@db:5432/x failed", &[]),
            "connect postgres://[redacted]@db:5432/x failed"
        );
        assert_eq!(
            sanitize("see https://example.com/a", &[]),
            "see https://example.com/a"
        );
    }

    #[test]
    fn bearer_and_pairs_are_removed() {
        let s = sanitize(
            "auth Bearer abc.def failed; password=hunter2 api_key: \"k-123\" ok",
            &[],
        );
        assert!(!s.contains("abc.def"), "{s}");
        assert!(!s.contains("hunter2"), "{s}");
        assert!(!s.contains("k-123"), "{s}");
        assert!(s.contains("ok"), "{s}");
    }

    #[test]
    fn named_secrets_are_removed() {
        let s = sanitize("the token s3cr3t-xyz leaked", &["s3cr3t-xyz"]);
        assert_eq!(s, "the token [redacted] leaked");
    }

    #[test]
    fn plain_text_is_untouched() {
        let text = "file not found: /tmp/a.txt (mode: read)";
        assert_eq!(sanitize(text, &[]), text);
        assert_eq!(sanitize("boom ünïcode", &[]), "boom ünïcode");
    }
}
