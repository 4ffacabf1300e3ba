//! How much of one kind of work the server takes on at once, so that a flood of it
//! cannot starve everything else: evidence verification (CPU and memory heavy, run off
//! the async workers) and waits (each holds a connection for minutes).
//! A caller beyond a bound gets a clear "busy" or "too many" error at once, instead of a
//! queue that grows without end.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::GateError;

/// Work that runs at most `running` at a time, with at most `queued` more waiting (for
/// at most `patience`); beyond that, callers are told the server is busy.
pub struct Lane {
    what: &'static str,
    permits: Arc<Semaphore>,
    running: usize,
    waiting: AtomicUsize,
    queued: usize,
    patience: Duration,
}

impl Lane {
    pub fn new(what: &'static str, running: usize, queued: usize, patience: Duration) -> Self {
        let running = running.max(1);
        Self {
            what,
            permits: Arc::new(Semaphore::new(running)),
            running,
            waiting: AtomicUsize::new(0),
            queued,
            patience,
        }
    }

    /// A turn: held while the work runs.
    pub async fn enter(&self) -> Result<OwnedSemaphorePermit, GateError> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Ok(permit);
        }
        let busy = || {
            GateError::Unavailable(format!(
                "the server is busy with {} (at most {} at a time, {} waiting); retry in a few seconds",
                self.what, self.running, self.queued
            ))
        };
        // Take a place in the queue, or refuse when it is full.
        let place = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.queued).then_some(n + 1)
            });
        if place.is_err() {
            return Err(busy());
        }
        let turn = tokio::time::timeout(self.patience, self.permits.clone().acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        match turn {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) | Err(_) => Err(busy()),
        }
    }
}

/// Counts what each holder (a token, an account) has open at once, up to a cap.
pub struct PerHolder {
    what: &'static str,
    cap: usize,
    open: Arc<Mutex<HashMap<String, usize>>>,
}

/// One open item of a holder; closes when dropped.
pub struct Held {
    holder: String,
    open: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.holder) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.holder);
            }
        }
    }
}

impl PerHolder {
    pub fn new(what: &'static str, cap: usize) -> Self {
        Self {
            what,
            cap,
            open: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Opens one more for `holder`, or says it has `cap` open already.
    pub fn open(&self, holder: &str) -> Result<Held, GateError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(holder.to_string()).or_insert(0);
        if *n >= self.cap {
            return Err(GateError::RateLimited {
                message: format!(
                    "{holder} already has {} {} open, the most allowed at once; let one finish first",
                    self.cap, self.what
                ),
                // Nothing frees one on a schedule; a second is a polite first retry.
                retry_after_seconds: 1,
            });
        }
        *n += 1;
        Ok(Held {
            holder: holder.to_string(),
            open: self.open.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_lane_says_busy_and_frees_its_turns() {
        let lane = Lane::new("evidence verifications", 1, 1, Duration::from_millis(50));
        let first = lane.enter().await.unwrap();
        // The second waits its turn (and gives up after its patience).
        let err = match lane.enter().await {
            Err(err) => err,
            Ok(_) => unreachable!("the only turn is taken"),
        };
        assert_eq!(err.code(), "unavailable");
        assert!(err.to_string().contains("busy with evidence verifications"));
        drop(first);
        assert!(lane.enter().await.is_ok());
    }

    #[test]
    fn a_holder_gets_its_cap_and_no_more() {
        let waits = PerHolder::new("waits", 2);
        let a = waits.open("token:a").unwrap();
        let _b = waits.open("token:a").unwrap();
        let err = waits.open("token:a").err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "token:a already has 2 waits open, the most allowed at once; let one finish first"
            )
        );
        assert!(waits.open("token:b").is_ok(), "others are not affected");
        drop(a);
        assert!(waits.open("token:a").is_ok());
    }
}
