//! What the metrics read from the runtime at a scrape, and the runtime's metric handles.
//! Counting itself happens where things happen (the pump, attachments, admission).

use super::Runtime;
use crate::agent::Processes;
use crate::metrics::{GaugeSource, Handles, Sample};

impl Runtime {
    /// Live runs parked on the client.
    pub fn suspended_runs(&self) -> usize {
        self.runs().suspended()
    }

    /// The memory budget (bytes).
    pub fn memory_budget(&self) -> usize {
        self.options().memory_budget
    }

    /// The processes of each agent backend that runs any, by agent name.
    pub fn agent_processes(&self) -> Vec<(&str, Processes)> {
        self.agents()
            .iter()
            .filter_map(|(name, agent)| Some((name.as_str(), agent.processes()?)))
            .collect()
    }
}

impl GaugeSource for Runtime {
    fn handles(&self) -> Handles {
        Handles {
            runs: self.run_metrics().clone(),
            streams: self.stream_metrics(),
            store: self.store().metrics().clone(),
            webhooks: self
                .webhooks()
                .map(|outbox| outbox.metrics().clone())
                .unwrap_or_default(),
            schedules: self.schedule_metrics().clone(),
            egress: self.options().egress_metrics.clone(),
        }
    }

    fn sample(&self) -> Sample {
        let gauge = self.gauge();
        Sample {
            live: gauge.active,
            capacity: gauge.capacity,
            suspended: self.suspended_runs(),
            memory_in_use: self.memory_in_use(),
            memory_budget: self.memory_budget(),
            retained_limit: self.retained_limit(),
            store_queue: self.store().queue_depth() as usize,
            processes: self
                .agent_processes()
                .into_iter()
                .map(|(name, p)| (name.to_owned(), p.busy, p.idle))
                .collect(),
        }
    }
}
