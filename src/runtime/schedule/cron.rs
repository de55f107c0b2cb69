//! A schedule's cron expression in its time zone: parsed once (croner, on jiff's time
//! zones), then asked for the occurrence after an instant and for the occurrences in a span.
//! Instants are milliseconds since the Unix epoch, as the store keeps them; occurrences
//! fall on whole seconds.

use croner::Cron;
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// Why an expression or a time zone was refused (the message names the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error(
        "cron is not a valid cron expression ({0}); five fields (minute hour day month weekday), or six with seconds first"
    )]
    Expression(String),
    #[error("cron never fires after now")]
    Never,
    #[error(
        "timezone is not a time zone this host knows ({0}); an IANA name such as Europe/Paris, or UTC"
    )]
    TimeZone(String),
}

impl CronError {
    /// The request field the error is about.
    pub fn field(&self) -> &'static str {
        match self {
            CronError::Expression(_) | CronError::Never => "cron",
            CronError::TimeZone(_) => "timezone",
        }
    }
}

/// A parsed expression and the time zone its fields are read in.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    cron: Cron,
    zone: TimeZone,
}

impl CronSchedule {
    /// Parses `expression` (five fields, or six with seconds first; `@daily`-style
    /// nicknames) read in time zone `timezone` (an IANA name from the host's database).
    pub fn parse(expression: &str, timezone: &str) -> Result<CronSchedule, CronError> {
        let zone = if timezone == "UTC" {
            TimeZone::UTC
        } else {
            TimeZone::get(timezone).map_err(|error| CronError::TimeZone(error.to_string()))?
        };
        let cron: Cron = expression
            .parse()
            .map_err(|error: croner::errors::CronError| CronError::Expression(error.to_string()))?;
        Ok(CronSchedule { cron, zone })
    }

    /// The first occurrence strictly after `ms`; `None` when there is none (within
    /// croner's search, a year of seconds ahead, or past the end of time jiff knows).
    pub fn after(&self, ms: i64) -> Option<i64> {
        let start = Timestamp::from_millisecond(ms)
            .ok()?
            .to_zoned(self.zone.clone());
        let next = self.cron.find_next_occurrence(&start, false).ok()?;
        Some(next.timestamp().as_millisecond())
    }

    /// The occurrences strictly after `from` and at most `to`, counted up to `cap`: how
    /// many, the first and the last (the last counted, when the cap stopped the count).
    pub fn between(&self, from: i64, to: i64, cap: i64) -> Span {
        let mut span = Span::default();
        let mut at = from;
        while span.count < cap {
            match self.after(at) {
                Some(next) if next <= to => {
                    span.first.get_or_insert(next);
                    span.last = Some(next);
                    span.count += 1;
                    at = next;
                }
                _ => break,
            }
        }
        span
    }
}

/// Occurrences in a span of time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    pub count: i64,
    pub first: Option<i64>,
    pub last: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-01-01T00:00:00Z.
    const NEW_YEAR: i64 = 1_767_225_600_000;

    #[test]
    fn occurrences_follow_the_expression_in_its_time_zone() {
        let every_second = CronSchedule::parse("* * * * * *", "UTC").expect("parse");
        assert_eq!(every_second.after(NEW_YEAR), Some(NEW_YEAR + 1_000));
        // Strictly after, from inside a second too.
        assert_eq!(every_second.after(NEW_YEAR + 400), Some(NEW_YEAR + 1_000));
        let daily_nine = CronSchedule::parse("0 9 * * *", "UTC").expect("parse");
        assert_eq!(daily_nine.after(NEW_YEAR), Some(NEW_YEAR + 9 * 3_600_000));
        // Nine in Paris is eight in UTC in January.
        let paris = CronSchedule::parse("0 9 * * *", "Europe/Paris").expect("parse");
        assert_eq!(paris.after(NEW_YEAR), Some(NEW_YEAR + 8 * 3_600_000));
    }

    #[test]
    fn a_span_counts_its_occurrences_up_to_the_cap() {
        let every_minute = CronSchedule::parse("* * * * *", "UTC").expect("parse");
        let span = every_minute.between(NEW_YEAR, NEW_YEAR + 3_600_000, 1_000);
        assert_eq!(
            span,
            Span {
                count: 60,
                first: Some(NEW_YEAR + 60_000),
                last: Some(NEW_YEAR + 3_600_000)
            }
        );
        assert_eq!(
            every_minute.between(NEW_YEAR, NEW_YEAR + 59_999, 10).count,
            0
        );
        let capped = every_minute.between(NEW_YEAR, NEW_YEAR + 3_600_000, 5);
        assert_eq!((capped.count, capped.last), (5, Some(NEW_YEAR + 300_000)));
    }

    #[test]
    fn bad_expressions_and_zones_name_their_field() {
        for bad in ["", "not cron", "61 * * * *", "* * * * * * * *"] {
            let error = CronSchedule::parse(bad, "UTC").expect_err(bad);
            assert_eq!(error.field(), "cron", "{bad}: {error}");
        }
        let error = CronSchedule::parse("* * * * *", "Mars/Olympus").expect_err("zone");
        assert_eq!(error.field(), "timezone");
        // A leap day two years ahead is found.
        let leap = CronSchedule::parse("0 0 29 2 *", "UTC").expect("parses");
        assert_eq!(leap.after(NEW_YEAR), Some(1_835_395_200_000)); // 2028-02-29
        // Croner finds no 30th of February within its search.
        let never = CronSchedule::parse("0 0 30 2 *", "UTC").expect("parses");
        assert_eq!(never.after(NEW_YEAR), None);
    }
}
