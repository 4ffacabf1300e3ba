//! What a run found, and how it is printed: the figures in `docs/benchmarks.md` and the
//! violations that fail the test are this text.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// What a run did and found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub seed: u64,
    pub cycles: u64,
    /// How each server process ended, by kind.
    pub kills: BTreeMap<String, u64>,
    pub violations: Vec<String>,
    pub acked: Acked,
    /// Operations whose answer never came (in flight when the server died).
    pub unanswered: u64,
    pub requests: usize,
    pub log_entries: u64,
    pub checkpoints: usize,
    pub webhook_events: u64,
    pub webhook_posts: u64,
    /// Posts of a webhook-id already received (at-least-once redelivery after a crash).
    pub redeliveries: u64,
    /// Posts the receiver refused on purpose, to exercise retries.
    pub refused: u64,
    /// The longest wait after a restart for due deliveries and integration.
    pub slowest_settle: Duration,
    /// Deliveries still leased by a killed sender at the end (without a final drain).
    pub undrained: usize,
    /// From an event's commit to its webhook's first arrival: p50, p99, max.
    pub delivery_delay: [Duration; 3],
    /// Deliveries that had to wait out the lease of a killed sender.
    pub lease_waits: usize,
    /// Where the time went.
    pub phases: BTreeMap<&'static str, Duration>,
    pub elapsed: Duration,
}

/// What the load saw acknowledged, by kind of write.
#[derive(Debug, Clone, Copy, Default)]
pub struct Acked {
    pub created: u64,
    pub idempotent_replays: u64,
    pub decisions: u64,
    pub lost_races: u64,
    pub cancels: u64,
    pub actions: u64,
    /// Proofs redeemed by the executor.
    pub redemptions: u64,
    pub outcomes: u64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.acked;
        writeln!(
            f,
            "crash harness: {} cycles, {} violations, {:.1} s (seed {:#x})",
            self.cycles,
            self.violations.len(),
            self.elapsed.as_secs_f64(),
            self.seed
        )?;
        writeln!(f, "  server processes ended by:")?;
        for (kind, n) in &self.kills {
            writeln!(f, "    {n:>6}  {kind}")?;
        }
        writeln!(
            f,
            "  acknowledged: {} requests created ({} idempotent replays), {} decisions, {} races lost (already_decided), {} cancels, {} actions, {} redemptions, {} outcomes; {} operations unanswered (in flight at a crash)",
            a.created,
            a.idempotent_replays,
            a.decisions,
            a.lost_races,
            a.cancels,
            a.actions,
            a.redemptions,
            a.outcomes,
            self.unanswered
        )?;
        writeln!(
            f,
            "  at the end: {} requests, {} log entries, {} checkpoints; {} events notified by webhook, {} posts received ({} redeliveries of a webhook-id, {} refused on purpose); slowest settle after a restart {:.2} s{}",
            self.requests,
            self.log_entries,
            self.checkpoints,
            self.webhook_events,
            self.webhook_posts,
            self.redeliveries,
            self.refused,
            self.slowest_settle.as_secs_f64(),
            if self.undrained > 0 {
                format!(
                    "; {} deliveries still leased by a killed sender (not drained)",
                    self.undrained
                )
            } else {
                String::new()
            }
        )?;
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|(k, v)| format!("{k} {:.1} s", v.as_secs_f64()))
            .collect();
        writeln!(f, "  time: {}", phases.join(", "))?;
        let [p50, p99, max] = self.delivery_delay;
        writeln!(
            f,
            "  webhook delay from commit to arrival: p50 {:.3} s, p99 {:.3} s, max {:.3} s; {} deliveries waited out the lease of a killed sender",
            p50.as_secs_f64(),
            p99.as_secs_f64(),
            max.as_secs_f64(),
            self.lease_waits
        )?;
        // The first ones say what broke; a lost write is then reported at every restart.
        for v in self.violations.iter().take(100) {
            writeln!(f, "  VIOLATION: {v}")?;
        }
        if self.violations.len() > 100 {
            writeln!(
                f,
                "  ... and {} more violations",
                self.violations.len() - 100
            )?;
        }
        Ok(())
    }
}
