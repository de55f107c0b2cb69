//! What the pump does about its run's spending (see `budget.rs` for the accounting): counts
//! what the agent spends, after every step checks the ceilings, shows and stores what was
//! spent, and at a ceiling asks the client whether to extend it once (pausing the run) or
//! ends the run.

use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::budget::{EXTEND, STOP, Scope};
use super::drive::Pump;
use crate::agent::{Hitl, PermissionOption, PermissionOutcome};
use crate::budget::{Reached, Spend};
use crate::runtime::CancelReason;
use crate::runtime::suspension::{self, Channel, Wait};
use crate::sync::lock;

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
            .run_metrics()
            .budget_reached(scope.name(), reached.measure.name());
        let budget = self.budget.as_ref().expect("checked above");
        budget.day_meter.count_reached();
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
                .store()
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
                        budget: true,
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
                        budget: true,
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
