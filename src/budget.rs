//! Budgets: what a run, a thread and a principal's day may spend (tokens from the agent's
//! usage reports, wall time while the run works, tool calls), and what has been spent. Only
//! the arithmetic lives here; the pump applies the limits (`runtime/run/budget.rs`), the
//! store keeps a principal's spending per day.

use serde::{Deserialize, Serialize};

/// Ceilings on each measure; `None`: no ceiling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Seconds of work (time parked waiting on the client does not count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_time: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u64>,
}

/// What has been spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spend {
    pub tokens: u64,
    pub wall_time_ms: u64,
    pub tool_calls: u64,
}

/// One measure a budget limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    Tokens,
    WallTime,
    ToolCalls,
}

impl Measure {
    pub fn name(self) -> &'static str {
        match self {
            Measure::Tokens => "tokens",
            Measure::WallTime => "wall_time",
            Measure::ToolCalls => "tool_calls",
        }
    }
}

/// A limit reached: which measure, its ceiling, and what was spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reached {
    pub measure: Measure,
    pub limit: u64,
    pub spent: u64,
}

impl std::fmt::Display for Reached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.measure {
            Measure::WallTime => write!(
                f,
                "{} s of wall time spent of {} s",
                self.spent / 1000,
                self.limit
            ),
            measure => write!(
                f,
                "{} {} spent of {}",
                self.spent,
                measure.name(),
                self.limit
            ),
        }
    }
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.tokens.is_none() && self.wall_time.is_none() && self.tool_calls.is_none()
    }

    /// The first ceiling `spent` has reached, if any: tokens and wall time once spent up
    /// to their ceiling, tool calls once a call past it was made (a ceiling of N allows N
    /// calls).
    pub fn reached(&self, spent: &Spend) -> Option<Reached> {
        let checks = [
            (Measure::Tokens, self.tokens, spent.tokens, 1, 0),
            (Measure::ToolCalls, self.tool_calls, spent.tool_calls, 1, 1),
            (
                Measure::WallTime,
                self.wall_time,
                spent.wall_time_ms,
                1000,
                0,
            ),
        ];
        checks
            .into_iter()
            .find_map(|(measure, limit, used, unit, past)| {
                let limit = limit?;
                (used >= limit.saturating_mul(unit).saturating_add(past)).then_some(Reached {
                    measure,
                    limit,
                    spent: used,
                })
            })
    }

    /// These limits with each ceiling raised by its own amount again (one extension).
    pub fn extended(&self) -> Limits {
        let twice = |limit: Option<u64>| limit.map(|l| l.saturating_mul(2));
        Limits {
            tokens: twice(self.tokens),
            wall_time: twice(self.wall_time),
            tool_calls: twice(self.tool_calls),
        }
    }

    /// Milliseconds of wall time left after `spent`, when wall time is limited.
    pub fn wall_left_ms(&self, spent: &Spend) -> Option<u64> {
        self.wall_time.map(|limit| {
            limit
                .saturating_mul(1000)
                .saturating_sub(spent.wall_time_ms)
        })
    }
}

impl Spend {
    pub fn add(&mut self, other: &Spend) {
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.wall_time_ms = self.wall_time_ms.saturating_add(other.wall_time_ms);
        self.tool_calls = self.tool_calls.saturating_add(other.tool_calls);
    }

    pub fn is_zero(&self) -> bool {
        *self == Spend::default()
    }
}

/// The configured budgets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Budgets {
    /// Per run, by default (an agent's `budget` replaces it): reaching it pauses the run to
    /// ask whether to extend it once.
    pub run: Limits,
    /// Per thread, over all its runs: reaching it pauses the run as `run` does.
    pub thread: Limits,
    /// Per principal per day (UTC), unless its token's `budget` claim says otherwise: a run
    /// that reaches it ends, and the day's next run is refused.
    pub principal: Limits,
    /// Per run, set by the operator: never extended; a run that reaches it ends.
    pub hard: Limits,
}

impl Budgets {
    pub fn is_empty(&self) -> bool {
        self.run.is_empty()
            && self.thread.is_empty()
            && self.principal.is_empty()
            && self.hard.is_empty()
    }
}

/// The day (UTC, days since the Unix epoch) of `now_ms`.
pub fn day_of(now_ms: u64) -> i64 {
    (now_ms / 86_400_000) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_ceiling_reached_is_named_and_extension_doubles() {
        let limits = Limits {
            tokens: Some(100),
            wall_time: Some(2),
            tool_calls: None,
        };
        let mut spent = Spend {
            tokens: 99,
            wall_time_ms: 1999,
            tool_calls: 50,
        };
        assert_eq!(limits.reached(&spent), None);
        spent.tokens = 100;
        let reached = limits.reached(&spent).expect("reached");
        assert_eq!((reached.measure, reached.limit), (Measure::Tokens, 100));
        assert_eq!(limits.extended().reached(&spent), None);
        spent.wall_time_ms = 4000;
        assert_eq!(
            limits.extended().reached(&spent).map(|r| r.measure),
            Some(Measure::WallTime)
        );
        assert_eq!(limits.wall_left_ms(&Spend::default()), Some(2000));
    }

    #[test]
    fn a_tool_call_ceiling_of_n_allows_n_calls() {
        let limits = Limits {
            tool_calls: Some(2),
            ..Limits::default()
        };
        let calls = |tool_calls| Spend {
            tool_calls,
            ..Spend::default()
        };
        assert_eq!(limits.reached(&calls(2)), None);
        assert_eq!(
            limits.reached(&calls(3)).map(|r| r.measure),
            Some(Measure::ToolCalls)
        );
    }
}
