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

use super::drive::Pump;
use crate::agent::{Hitl, PermissionOption, PermissionOutcome};
use crate::budget::{Limits, Reached, Spend};
use crate::runtime::CancelReason;
use crate::runtime::suspension::{self, Channel, Wait};
use crate::sync::lock;

/// The option of a budget question that extends the budget.
const EXTEND: &str = "extend";
/// The option that stops the run.
const STOP: &str = "stop";

/// Which budget was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Run,
    Thread,
    Day,
    Hard,
}

impl Scope {
    fn name(self) -> &'static str {
        match self {
            Scope::Run => "run",
            Scope::Thread => "thread",
            Scope::Day => "principal",
            Scope::Hard => "hard",
        }
    }

    fn described(self) -> &'static str {
        match self {
            Scope::Run => "the run's budget",
            Scope::Thread => "the thread's budget",
            Scope::Day => "the principal's daily budget",
            Scope::Hard => "the run's hard budget",
        }
    }
}

/// A principal's spending on one day on this node: what the store had when the first of
/// its runs started, plus what each run of it has spent since.
#[derive(Debug, Default)]
pub(in crate::runtime) struct DayMeter {
    seeded: tokio::sync::OnceCell<()>,
    spent: std::sync::Mutex<Spend>,
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

    fn add(&self, spend: &Spend) {
        lock(&self.spent).add(spend);
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
    stored: Spend,
    extended: bool,
    /// Since when the run has been working (`None` while parked).
    working_since: Option<Instant>,
    /// The answer to a pause, while paused.
    paused: Option<oneshot::Receiver<PermissionOutcome>>,
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
    fn reached(&self) -> Option<(Scope, Reached)> {
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
    fn wall_due(&self) -> Option<Instant> {
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
    fn shown(&self) -> serde_json::Value {
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

impl Pump {
    /// Counts `spend` against the run's budgets.
    pub(in crate::runtime) fn spend(&mut self, spend: Spend) {
        if let Some(budget) = &mut self.budget {
            budget.spent.add(&spend);
            self.budget_changed = true;
        }
    }

    /// Whether the run is paused on its budget (the agent's output is not taken).
    pub(in crate::runtime) fn budget_paused(&self) -> bool {
        self.budget.as_ref().is_some_and(|b| b.paused.is_some())
    }

    /// When the wall time left runs out (the drive loop wakes then).
    pub(in crate::runtime) fn budget_wall_due(&self) -> Option<Instant> {
        self.budget.as_ref().and_then(|budget| budget.wall_due())
    }

    /// Waits for the answer to the budget question (only while paused).
    pub(in crate::runtime) async fn budget_answer(&mut self) -> PermissionOutcome {
        let Some(rx) = self.budget.as_mut().and_then(|b| b.paused.as_mut()) else {
            return std::future::pending().await;
        };
        rx.await.unwrap_or(PermissionOutcome::Denied {
            reason: "nobody answered".to_owned(),
        })
    }

    /// The answer to the budget question: extended once, or the run ends.
    pub(in crate::runtime) fn on_budget_answer(&mut self, outcome: PermissionOutcome) {
        let Some(budget) = &mut self.budget else {
            return;
        };
        budget.paused = None;
        match outcome {
            PermissionOutcome::Selected { option_id } if option_id == EXTEND => {
                tracing::info!("budget extended once");
                budget.extended = true;
                budget.run = budget.run.extended();
                budget.thread = budget.thread.extended();
                self.budget_changed = true;
            }
            _ => {
                let reached = budget.reached();
                self.end_on_budget(reached.map_or(Scope::Run, |(scope, _)| scope), None);
            }
        }
    }

    /// After every step: the wall time counted, what changed shown and stored, and the
    /// ceilings checked.
    pub(in crate::runtime) fn check_budget(&mut self) {
        let working = self.deadline.is_none();
        let Some(budget) = &mut self.budget else {
            return;
        };
        let now = Instant::now();
        if let Some(since) = budget.working_since.take() {
            budget.spent.wall_time_ms += now.duration_since(since).as_millis() as u64;
        }
        if working && budget.paused.is_none() {
            budget.working_since = Some(now);
        }
        // Checked while the run works: parked on the client it spends nothing more, and
        // the segment it parked on has already ended.
        if !working || budget.paused.is_some() || self.writer.run.cancel.is_cancelled() {
            return;
        }
        let reached = budget.reached();
        if std::mem::take(&mut self.budget_changed) || reached.is_some() {
            self.store_budget();
        }
        let Some((scope, reached)) = reached else {
            return;
        };
        self.writer
            .rt
            .inner
            .run_metrics
            .budget_reached(scope.name(), reached.measure.name());
        let budget = self.budget.as_ref().expect("checked above");
        let run = lock(&self.writer.run.translator).run_id().to_owned();
        self.writer.rt.notify(
            crate::webhooks::Event::budget_reached(
                self.writer.thread.key.as_str(),
                &budget.owner,
                json!({
                    "budget": scope.name(),
                    "measure": reached.measure.name(),
                    "limit": reached.limit,
                    "spent": reached.spent,
                    "extended": budget.extended,
                }),
            )
            .run(&run)
            .agent(&self.writer.thread.agent),
        );
        let background = self
            .writer
            .run
            .background
            .load(std::sync::atomic::Ordering::SeqCst);
        let soft = matches!(scope, Scope::Run | Scope::Thread);
        if soft && !budget.extended && !background {
            self.ask_budget(scope, reached);
        } else {
            self.end_on_budget(scope, Some(reached));
        }
    }

    /// Shows the spending in the thread's state, and adds what is new to the principal's
    /// day in the store.
    fn store_budget(&mut self) {
        let Some(budget) = &mut self.budget else {
            return;
        };
        let mut delta = budget.spent;
        delta.tokens -= budget.stored.tokens;
        delta.tool_calls -= budget.stored.tool_calls;
        delta.wall_time_ms -= budget.stored.wall_time_ms;
        budget.stored = budget.spent;
        let shown = budget.shown();
        if !delta.is_zero() {
            budget.day_meter.add(&delta);
            self.writer
                .rt
                .inner
                .store
                .add_spend(&budget.owner, budget.day_number, &delta);
        }
        self.writer.set_state("/budget", shown);
    }

    /// Ends the run on `scope`'s budget: its turn is cancelled, and the run ends with
    /// `RUN_ERROR{code:"BUDGET_EXCEEDED"}`.
    fn end_on_budget(&mut self, scope: Scope, reached: Option<Reached>) {
        let message = match reached {
            Some(reached) => format!("{} is spent ({reached})", scope.described()),
            None => format!("stopped at {}", scope.described()),
        };
        tracing::info!(%message, "run ended on its budget");
        *lock(&self.writer.run.budget_note) = Some(message);
        self.writer.run.cancel_with(CancelReason::Budget);
    }

    /// Pauses the run and asks the client whether to extend `scope`'s budget once.
    fn ask_budget(&mut self, scope: Scope, reached: Reached) {
        let (reply, rx) = oneshot::channel();
        if let Some(budget) = &mut self.budget {
            budget.paused = Some(rx);
        }
        let title = format!(
            "{} is reached ({reached}): extend it once, or stop the run",
            capitalized(scope.described())
        );
        let options = vec![
            PermissionOption {
                option_id: EXTEND.to_owned(),
                name: "Extend the budget once".to_owned(),
                kind: "allow_once".to_owned(),
            },
            PermissionOption {
                option_id: STOP.to_owned(),
                name: "Stop the run".to_owned(),
                kind: "reject_once".to_owned(),
            },
        ];
        let about = json!({
            "reason": "budget_reached",
            "budget": scope.name(),
            "measure": reached.measure.name(),
            "limit": reached.limit,
            "spent": reached.spent,
        });
        match self.hitl {
            Hitl::Tool => {
                let id = format!("budget-{}", uuid::Uuid::new_v4());
                let mut arguments = about.clone();
                arguments["title"] = json!(title);
                arguments["options"] = json!(options);
                self.call_on_client(
                    &id,
                    suspension::PERMISSION_TOOL.to_owned(),
                    arguments.to_string(),
                );
                self.suspend(
                    Channel::ToolMessages,
                    vec![Wait::Permission {
                        answer_id: id,
                        options,
                        reply,
                    }],
                    Vec::new(),
                );
            }
            Hitl::Interrupt => {
                let mut metadata = about;
                metadata["options"] = json!(options);
                let interrupt = self.interrupt(
                    "budget_reached",
                    &title,
                    None,
                    suspension::response_schema(&options),
                    Some(metadata),
                );
                let id = interrupt.id.clone();
                self.suspend(
                    Channel::Interrupts,
                    vec![Wait::Permission {
                        answer_id: id,
                        options,
                        reply,
                    }],
                    vec![interrupt],
                );
            }
        }
    }
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
