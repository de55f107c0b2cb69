//! A run's budgets, applied by its pump: what the run spends (tokens from the agent's usage
//! reports, tool calls, wall time while it works), checked after every step against its
//! run, thread, daily and hard ceilings.
//!
//! A run or thread budget reached pauses the run: the pump stops taking the agent's output
//! (the agent waits on its sink) and asks the client, the way it asks a permission, whether
//! to extend the budget once (each ceiling doubled) or stop. The question is an AG-UI
//! interrupt with reason `budget_reached`, or (tool channel) an `agui_permission_request`
//! whose arguments say `"reason":"budget_reached"`. A run nobody started from a stream (a
//! background or queued run) is not asked; neither is one already extended. A hard or
//! daily ceiling is never extended. Whatever is not extended ends the run with
//! `RUN_ERROR{code:"BUDGET_EXCEEDED"}` naming the budget.
//!
//! What was spent is in the thread's state (`/budget`), which the store keeps, and each
//! principal's day is added up in the store. A principal's day is also one [`DayMeter`]
//! per node, which every run of the principal (parallel, scheduled, queued) adds to as it
//! spends and checks its daily ceiling against, so parallel runs share one daily budget
//! instead of each spending all of it.

use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::agent::PermissionOutcome;
use crate::budget::{Limits, Reached, Spend};
use crate::sync::lock;
use std::sync::Arc;

/// The option of a budget question that extends the budget.
pub(super) const EXTEND: &str = "extend";
/// The option that stops the run.
pub(super) const STOP: &str = "stop";

/// Which budget was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    Run,
    Thread,
    Day,
    Hard,
}

impl Scope {
    pub(super) fn name(self) -> &'static str {
        match self {
            Scope::Run => "run",
            Scope::Thread => "thread",
            Scope::Day => "principal",
            Scope::Hard => "hard",
        }
    }

    pub(super) fn described(self) -> &'static str {
        match self {
            Scope::Run => "the run's budget",
            Scope::Thread => "the thread's budget",
            Scope::Day => "the principal's daily budget",
            Scope::Hard => "the run's hard budget",
        }
    }
}

/// Each principal's day of spending on this node, shared by its runs.
#[derive(Debug, Default)]
pub(in crate::runtime) struct Days {
    by_owner: std::sync::Mutex<std::collections::HashMap<(String, i64), Arc<DayMeter>>>,
}

/// One principal's day as the fleet shows it.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::runtime) struct DayView {
    pub(in crate::runtime) owner: String,
    pub(in crate::runtime) spent: Spend,
    /// The daily ceiling its last run started under (empty: none).
    pub(in crate::runtime) limits: Limits,
    /// How many budgets its runs reached today on this node.
    pub(in crate::runtime) reached: u64,
}

impl Days {
    /// The meter of `owner`'s day `day_number` (made on first use; the meters of earlier
    /// days are dropped then).
    pub(in crate::runtime) fn meter(&self, owner: &str, day_number: i64) -> Arc<DayMeter> {
        let mut days = crate::sync::lock(&self.by_owner);
        days.retain(|(_, day), _| *day >= day_number);
        days.entry((owner.to_owned(), day_number))
            .or_default()
            .clone()
    }

    /// Every principal's day `day_number` that has a meter on this node, by owner.
    pub(in crate::runtime) fn on(&self, day_number: i64) -> Vec<DayView> {
        let days = crate::sync::lock(&self.by_owner);
        let mut views: Vec<DayView> = days
            .iter()
            .filter(|((_, day), _)| *day == day_number)
            .map(|((owner, _), meter)| DayView {
                owner: owner.clone(),
                spent: meter.spent(),
                limits: *lock(&meter.limits),
                reached: meter.reached.load(std::sync::atomic::Ordering::Relaxed),
            })
            .collect();
        views.sort_by(|a, b| a.owner.cmp(&b.owner));
        views
    }
}

/// A principal's spending on one day on this node: what the store had when the first of
/// its runs started, plus what each run of it has spent since.
#[derive(Debug, Default)]
pub(in crate::runtime) struct DayMeter {
    seeded: tokio::sync::OnceCell<()>,
    spent: std::sync::Mutex<Spend>,
    /// The daily ceiling the principal's last run started under.
    limits: std::sync::Mutex<Limits>,
    /// Budgets its runs reached.
    reached: std::sync::atomic::AtomicU64,
}

impl DayMeter {
    /// Adds what the store had for the day, once, before the meter is used.
    pub(in crate::runtime) async fn seed<F, E>(&self, stored: F) -> Result<(), E>
    where
        F: std::future::Future<Output = Result<Spend, E>>,
    {
        self.seeded
            .get_or_try_init(|| async {
                let stored = stored.await?;
                lock(&self.spent).add(&stored);
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// The day's spending so far.
    pub(in crate::runtime) fn spent(&self) -> Spend {
        *lock(&self.spent)
    }

    pub(super) fn add(&self, spend: &Spend) {
        lock(&self.spent).add(spend);
    }

    /// The daily ceiling of the run starting now.
    pub(in crate::runtime) fn started_under(&self, limits: Limits) {
        *lock(&self.limits) = limits;
    }

    /// One of the principal's runs reached a budget.
    pub(super) fn count_reached(&self) {
        self.reached
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A run's ceilings and spending.
#[derive(Debug)]
pub(in crate::runtime) struct RunBudget {
    pub(in crate::runtime) run: Limits,
    pub(in crate::runtime) thread: Limits,
    /// What the thread's earlier runs spent.
    pub(in crate::runtime) thread_before: Spend,
    pub(in crate::runtime) day: Limits,
    /// The principal's day (every run's spending of it; this run's added as it is stored).
    pub(in crate::runtime) day_meter: std::sync::Arc<DayMeter>,
    /// The principal, and the day its spending is added to.
    pub(in crate::runtime) owner: String,
    pub(in crate::runtime) day_number: i64,
    pub(in crate::runtime) hard: Limits,
    /// This run's spending, and how much of it the store has.
    pub(in crate::runtime) spent: Spend,
    pub(super) stored: Spend,
    pub(super) extended: bool,
    /// Since when the run has been working (`None` while parked).
    pub(super) working_since: Option<Instant>,
    /// The answer to a pause, while paused.
    pub(super) paused: Option<oneshot::Receiver<PermissionOutcome>>,
}

impl RunBudget {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::runtime) fn new(
        run: Limits,
        thread: Limits,
        thread_before: Spend,
        day: Limits,
        day_meter: std::sync::Arc<DayMeter>,
        owner: String,
        day_number: i64,
        hard: Limits,
    ) -> RunBudget {
        RunBudget {
            run,
            thread,
            thread_before,
            day,
            day_meter,
            owner,
            day_number,
            hard,
            spent: Spend::default(),
            stored: Spend::default(),
            extended: false,
            working_since: Some(Instant::now()),
            paused: None,
        }
    }

    /// The first ceiling reached, with its scope.
    pub(super) fn reached(&self) -> Option<(Scope, Reached)> {
        let with = |before: &Spend| {
            let mut total = *before;
            total.add(&self.spent);
            total
        };
        if let Some(reached) = self.hard.reached(&self.spent) {
            return Some((Scope::Hard, reached));
        }
        if let Some(reached) = self.day.reached(&with(&self.day_unstored())) {
            return Some((Scope::Day, reached));
        }
        if let Some(reached) = self.run.reached(&self.spent) {
            return Some((Scope::Run, reached));
        }
        self.thread
            .reached(&with(&self.thread_before))
            .map(|reached| (Scope::Thread, reached))
    }

    /// When the wall time left runs out, if wall time is limited and the run works.
    pub(super) fn wall_due(&self) -> Option<Instant> {
        let since = self.working_since?;
        let left = [
            self.hard.wall_left_ms(&self.spent),
            self.run.wall_left_ms(&self.spent),
            self.day
                .wall_left_ms(&with_spent(&self.day_unstored(), &self.spent)),
            self.thread
                .wall_left_ms(&with_spent(&self.thread_before, &self.spent)),
        ]
        .into_iter()
        .flatten()
        .min()?;
        Some(since + std::time::Duration::from_millis(left))
    }

    /// The principal's day less what this run has stored of its own (this run's whole
    /// spending is added back by the callers).
    fn day_unstored(&self) -> Spend {
        let day = self.day_meter.spent();
        Spend {
            tokens: day.tokens.saturating_sub(self.stored.tokens),
            wall_time_ms: day.wall_time_ms.saturating_sub(self.stored.wall_time_ms),
            tool_calls: day.tool_calls.saturating_sub(self.stored.tool_calls),
        }
    }

    /// The thread's spending as its state shows it.
    pub(super) fn shown(&self) -> serde_json::Value {
        json!({
            "run": self.spent,
            "thread": with_spent(&self.thread_before, &self.spent),
            "limits": {"run": self.run, "thread": self.thread, "principal": self.day,
                       "hard": self.hard},
        })
    }
}

fn with_spent(before: &Spend, spent: &Spend) -> Spend {
    let mut total = *before;
    total.add(spent);
    total
}
