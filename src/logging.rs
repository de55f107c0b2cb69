//! Logging: the tracing subscriber, and the writer that keeps secrets out of every line.
//!
//! Every secret the process holds is registered here while it is live: the bearer token
//! for the whole run, each MCP endpoint's secret while the endpoint exists. Whatever a log
//! line holds, from our code or from any crate's (the ACP crate at trace level prints the
//! `session/new` request with the MCP URL and headers; a client can put the token in any
//! query name or path), every occurrence of a registered value, as written or JSON-,
//! `Debug`- or percent-encoded, is replaced by `[redacted]` before the line is written.
//! Every control character in a line (but its newline and the formatter's own colours) is
//! escaped, so a value from a client or an agent cannot forge lines or drive a terminal.
//! The transport crates are still capped at `info`: their trace output is raw frames, where
//! a value can be split or compressed (HPACK) beyond recognition.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use serde::Deserialize;

const REDACTED: &str = "[redacted]";

/// The spellings of every registered secret, by registration.
static SECRETS: RwLock<BTreeMap<u64, Vec<String>>> = RwLock::new(BTreeMap::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Keeps a secret registered; dropping it unregisters the secret.
#[derive(Debug)]
pub struct SecretGuard {
    id: u64,
}

impl Drop for SecretGuard {
    fn drop(&mut self) {
        write_lock().remove(&self.id);
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Scrubs `secret` from every log line until the guard is dropped.
pub fn register(secret: &str) -> SecretGuard {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    write_lock().insert(id, spellings(secret));
    SecretGuard { id }
}

/// `text` with every registered secret replaced by `[redacted]`.
pub fn scrub(text: &str) -> std::borrow::Cow<'_, str> {
    let secrets = SECRETS.read().unwrap_or_else(|e| e.into_inner());
    let mut out = std::borrow::Cow::Borrowed(text);
    for spelling in secrets.values().flatten() {
        if out.contains(spelling.as_str()) {
            out = std::borrow::Cow::Owned(out.replace(spelling.as_str(), REDACTED));
        }
    }
    out
}

/// Installs the global subscriber: `RUST_LOG` levels (default `info`) with the transport
/// crates capped at `info`, text or JSON lines on stderr, every line scrubbed.
pub fn init(format: LogFormat, ansi: bool) {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Transport crates log raw frames at debug/trace; those may hold request headers (and
    // so a bearer token) in pieces the scrubber cannot recognise.
    for directive in [
        "h2=info",
        "hyper=info",
        "hyper_util=info",
        "rustls=info",
        "tokio_rustls=info",
    ] {
        if let Ok(directive) = directive.parse() {
            filter = filter.add_directive(directive);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(ScrubbedStderr { ansi });
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The ways a secret can be spelled in a log line.
fn spellings(secret: &str) -> Vec<String> {
    let trim = |quoted: String| quoted[1..quoted.len() - 1].to_owned();
    let mut out = vec![
        secret.to_owned(),
        trim(serde_json::Value::from(secret).to_string()),
        trim(format!("{secret:?}")),
        form_urlencoded::byte_serialize(secret.as_bytes()).collect(),
        percent_encoding::utf8_percent_encode(secret, percent_encoding::NON_ALPHANUMERIC)
            .to_string(),
    ];
    out.retain(|s| !s.is_empty());
    out.sort();
    out.dedup();
    // Longest first, so that no spelling is cut by a shorter one inside it.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out
}

fn write_lock() -> std::sync::RwLockWriteGuard<'static, BTreeMap<u64, Vec<String>>> {
    SECRETS.write().unwrap_or_else(|e| e.into_inner())
}

/// `line` with every control character escaped (`\n`, `\r`, `\u{1b}`, ...) except its
/// final newline, tabs, and, when `ansi`, the colour codes (`ESC [ digits ; m`) the
/// formatter itself writes: whatever a client or an agent managed to get into a field, one
/// event stays one line and cannot drive the terminal.
pub fn escape_controls(line: &str, ansi: bool) -> std::borrow::Cow<'_, str> {
    let body = line.strip_suffix('\n').unwrap_or(line);
    if !body.chars().any(|c| c.is_control() && c != '\t') {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len() + 16);
    let mut rest = body;
    while let Some(c) = rest.chars().next() {
        let len = c.len_utf8();
        if c == '\x1b'
            && ansi
            && let Some(sgr) = colour_code(rest)
        {
            out.push_str(&rest[..sgr]);
            rest = &rest[sgr..];
            continue;
        }
        if c.is_control() && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        rest = &rest[len..];
    }
    if body.len() < line.len() {
        out.push('\n');
    }
    std::borrow::Cow::Owned(out)
}

/// The length of the SGR sequence (`ESC [ 0-9;* m`) at the start of `text`, if any.
fn colour_code(text: &str) -> Option<usize> {
    let params = text.strip_prefix("\x1b[")?;
    let digits = params
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b';')
        .count();
    (params.as_bytes().get(digits) == Some(&b'm')).then_some(2 + digits + 1)
}

/// Makes one [`LineWriter`] per event.
struct ScrubbedStderr {
    ansi: bool,
}

impl<'a> MakeWriter<'a> for ScrubbedStderr {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> LineWriter {
        LineWriter {
            buf: Vec::new(),
            ansi: self.ansi,
        }
    }
}

/// Collects one formatted event, scrubs and escapes it, and writes it to stderr when
/// dropped.
struct LineWriter {
    buf: Vec<u8>,
    ansi: bool,
}

impl Write for LineWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buf);
        let scrubbed = scrub(&text);
        let line = escape_controls(&scrubbed, self.ansi);
        // One locked write per line, so lines from different threads never interleave.
        // Nowhere to report a failed log write.
        let _ = io::stderr().lock().write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_but_the_newline_and_colours_are_kept() {
        assert_eq!(escape_controls("plain line\n", false), "plain line\n");
        assert_eq!(
            escape_controls(
                "id=a\r\nFORGED \u{1b}]0;title\u{7}\u{0}\u{7f}\u{85}\n",
                false
            ),
            "id=a\\r\\nFORGED \\u{1b}]0;title\\u{7}\\u{0}\\u{7f}\\u{85}\n"
        );
        let coloured = "\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m x=\u{1b}[2J\n";
        assert_eq!(
            escape_controls(coloured, true),
            "\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m x=\\u{1b}[2J\n"
        );
        assert!(!escape_controls(coloured, false).contains('\u{1b}'));
    }

    #[test]
    fn every_spelling_of_a_registered_secret_is_scrubbed_until_it_is_dropped() {
        let guard = register("tok\"en/with+odd=chars");
        for line in [
            "GET /agui/info?access_token=tok\"en/with+odd=chars",
            r#"{"url":"x?a=1;token=tok\"en/with+odd=chars"}"#,
            "url=x?token=tok%22en%2Fwith%2Bodd%3Dchars",
        ] {
            let scrubbed = scrub(line);
            assert!(scrubbed.contains(REDACTED), "{line} -> {scrubbed}");
            assert!(!scrubbed.contains("odd"), "{line} -> {scrubbed}");
        }
        assert_eq!(scrub("nothing here"), "nothing here");
        drop(guard);
        assert_eq!(
            scrub("tok\"en/with+odd=chars"),
            "tok\"en/with+odd=chars",
            "unregistered"
        );
    }
}
