//! Wall-clock time as the daemon stores and shows it: milliseconds since the Unix epoch,
//! written as RFC 3339 with milliseconds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for a clock set before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `ms` since the epoch as RFC 3339 (`2026-12-02T15:20:00.000Z`); a negative time is the
/// epoch.
pub(crate) fn rfc3339(ms: i64) -> String {
    let time = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(time).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_are_written_with_milliseconds() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339(-5), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339(1_500), "1970-01-01T00:00:01.500Z");
    }
}
