//! How measurements become figures: latency samples and their percentiles, and the
//! machine's load average printed beside every result.

use std::time::Duration;

/// Latencies in microseconds, sorted.
pub(crate) struct Sample(pub(crate) Vec<u64>);

impl Sample {
    pub(crate) fn new(mut micros: Vec<u64>) -> Sample {
        micros.sort_unstable();
        Sample(micros)
    }
    pub(crate) fn pct(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let i = ((self.0.len() as f64 - 1.0) * p).round() as usize;
        self.0[i] as f64 / 1000.0
    }
    pub(crate) fn max(&self) -> f64 {
        self.0.last().copied().unwrap_or(0) as f64 / 1000.0
    }
}

/// A duration in whole microseconds, the unit samples hold.
pub(crate) fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// The 1-minute load average, to tell a quiet machine from a busy one.
pub(crate) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}
