//! What the metrics read from the runtime at a scrape, and the runtime's metric handles.
//! Counting itself happens where things happen (the pump, attachments, admission).

use std::sync::Arc;

use super::{Phase, Runtime};
use crate::agent::Processes;
use crate::metrics::{GaugeSource, Handles, RunMetrics, Sample, StreamMetrics};
use crate::sync::lock;

impl Runtime {
    /// The run counters (per agent, refusals, reattaches).
    pub fn run_metrics(&self) -> &RunMetrics {
        &self.inner.run_metrics
    }

    /// The stream gauge and cut counters.
    pub fn stream_metrics(&self) -> Arc<StreamMetrics> {
        self.inner.streams.clone()
    }

    /// Live runs parked on the client.
    pub fn suspended_runs(&self) -> usize {
        // A run is in the map under each of its segments' ids: count it under its own.
        lock(&self.inner.runs)
            .iter()
            .filter(|(key, run)| {
                crate::access::split_key(key).1 == run.id && run.phase.get() == Phase::Suspended
            })
            .count()
    }

    /// The memory budget (bytes).
    pub fn memory_budget(&self) -> usize {
        self.inner.options.memory_budget
    }

    /// The processes of each agent backend that runs any, by agent name.
    pub fn agent_processes(&self) -> Vec<(&str, Processes)> {
        self.inner
            .agents
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
            egress: self.inner.options.egress_metrics.clone(),
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
