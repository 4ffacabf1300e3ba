//! The events this process's writer committed last, kept for this process's change feed.
//!
//! The feed reads every new event in order (waiters, the log's integration, the outbox).
//! Read back from the database, each one costs a read transaction, its pages and a JSON
//! parse of an entry this process built a moment before: a tenth of the server's CPU
//! under load. So the writer, once a batch has committed, puts its events here, and the
//! feed takes a run of them from here when the run starts right after where it is.
//! Anything not here (another process's commits, older events, a gap) is read from the
//! database as before; an event is put here only once committed, so what the feed gets
//! is the same either way.
//!
//! A commit's events are visible to readers a moment before the writer can put them
//! here (SQLite finishes the commit first). A feed that reads in that moment would read
//! and parse them from the database after all, and under a steady load it often did; so
//! the writer says when a commit is landing, and a reader that finds nothing here waits
//! for it to land (at most [`LANDING`]) before it reads.
//!
//! And the change feed, once it has taken a run from here, reads the database for more
//! only if another process may have committed since its last read: one signalled a
//! commit (watch.rs), or that read is [`READ_AT_LEAST_EVERY`] old, which keeps the feed's
//! poll the bound on how late another process's commit is seen when its signal was
//! missed.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use countersign_store::StoredEvent;

/// How many events are kept: many batches' worth, a small fraction of memory.
const KEEP: usize = 4096;
/// The longest a reader waits for a landing commit before it reads the database.
const LANDING: Duration = Duration::from_millis(5);
/// A follower reads the database at least this often, signalled or not.
pub(crate) const READ_AT_LEAST_EVERY: Duration = Duration::from_millis(40);

#[derive(Default)]
pub(crate) struct Recent {
    events: Mutex<BTreeMap<u64, StoredEvent>>,
    /// From just before a COMMIT until its events are here (or it failed).
    landing: AtomicBool,
    landed: tokio::sync::Notify,
    /// Another process signalled a commit since a follower last read the database.
    foreign: AtomicBool,
    /// When a follower last read the database.
    last_read: Mutex<Option<std::time::Instant>>,
}

impl Recent {
    /// Another process signalled a commit (watch.rs).
    pub(crate) fn foreign_commit(&self) {
        self.foreign.store(true, Ordering::Release);
    }

    /// A follower found nothing here and reads the database.
    pub(crate) fn reading(&self) {
        self.foreign.store(false, Ordering::Release);
        *self
            .last_read
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(std::time::Instant::now());
    }

    /// Whether another process may have committed since a follower last read the
    /// database: it signalled a commit, or the last read is old.
    pub(crate) fn changed_elsewhere(&self) -> bool {
        self.foreign.load(Ordering::Acquire)
            || self
                .last_read
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .is_none_or(|at| at.elapsed() >= READ_AT_LEAST_EVERY)
    }

    /// A COMMIT is about to run.
    pub(crate) fn landing(&self) {
        self.landing.store(true, Ordering::Release);
    }

    /// The COMMIT is over: `committed` are its events (none when it failed).
    pub(crate) fn landed(&self, committed: Vec<StoredEvent>) {
        self.keep(committed);
        self.landing.store(false, Ordering::Release);
        self.landed.notify_waiters();
    }

    /// Waits for a landing commit, if one is; whether there was one.
    pub(crate) async fn settled(&self) -> bool {
        let landed = self.landed.notified();
        tokio::pin!(landed);
        // Registered before the flag is read, so a landing that ends in between wakes it.
        landed.as_mut().enable();
        if !self.landing.load(Ordering::Acquire) {
            return false;
        }
        let _ = tokio::time::timeout(LANDING, landed).await;
        true
    }

    /// Keeps `committed` (events of one committed batch).
    pub(crate) fn keep(&self, committed: Vec<StoredEvent>) {
        if committed.is_empty() {
            return;
        }
        let mut events = self.lock();
        for event in committed {
            events.insert(event.seq, event);
        }
        while events.len() > KEEP {
            events.pop_first();
        }
    }

    /// The events right after `after`, in order, as long as they run without a gap (at
    /// most `limit`); none when the next one is not here.
    pub(crate) fn after(&self, after: u64, limit: usize) -> Vec<StoredEvent> {
        let events = self.lock();
        let first = after.saturating_add(1);
        (first..)
            .zip(events.range(first..))
            .take_while(|(expected, (seq, _))| *seq == expected)
            .take(limit)
            .map(|(_, (_, event))| event.clone())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, StoredEvent>> {
        // A map of committed events stays consistent even if a holder panicked.
        self.events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

thread_local! {
    /// The events the writer thread's current transaction appended.
    static APPENDED: RefCell<Vec<StoredEvent>> = const { RefCell::new(Vec::new()) };
}

/// Notes an event appended in the writer's transaction (not committed yet).
pub(crate) fn appended(event: StoredEvent) {
    APPENDED.with(|a| a.borrow_mut().push(event));
}

/// How many events the transaction has appended so far (a savepoint's mark).
pub(crate) fn mark() -> usize {
    APPENDED.with(|a| a.borrow().len())
}

/// Forgets the events appended since `mark` (their savepoint was rolled back).
pub(crate) fn roll_back_to(mark: usize) {
    APPENDED.with(|a| a.borrow_mut().truncate(mark));
}

/// The events the transaction appended, taken (at its commit or its rollback).
pub(crate) fn take() -> Vec<StoredEvent> {
    APPENDED.with(|a| std::mem::take(&mut *a.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64) -> StoredEvent {
        countersign_store::rows::decode_event(
            seq as i64,
            br#"{"actor":null,"at":"2026-12-04T00:00:00.000Z","data":{},"subject":null,"type":"request_created","v":1}"#
                .to_vec(),
        )
        .unwrap()
    }

    #[test]
    fn only_a_run_that_starts_right_after_is_taken() {
        let recent = Recent::default();
        recent.keep(vec![event(5), event(6), event(8)]);
        assert!(recent.after(3, 10).is_empty(), "4 is not here");
        let run: Vec<u64> = recent.after(4, 10).iter().map(|e| e.seq).collect();
        assert_eq!(run, [5, 6], "stops at the gap");
        assert_eq!(recent.after(4, 1).len(), 1, "at most the limit");
        assert_eq!(recent.after(7, 10)[0].seq, 8);
        assert!(recent.after(8, 10).is_empty());
    }

    #[test]
    fn another_process_may_have_committed_when_it_said_so_or_when_the_read_is_old() {
        let recent = Recent::default();
        assert!(recent.changed_elsewhere(), "never read yet");
        recent.reading();
        assert!(!recent.changed_elsewhere(), "just read, nothing signalled");
        recent.foreign_commit();
        assert!(recent.changed_elsewhere(), "another process committed");
        recent.reading();
        assert!(!recent.changed_elsewhere());
        std::thread::sleep(READ_AT_LEAST_EVERY);
        assert!(recent.changed_elsewhere(), "the last read is old");
    }

    #[test]
    fn the_oldest_go_first() {
        let recent = Recent::default();
        recent.keep((1..=KEEP as u64 + 10).map(event).collect());
        assert!(recent.after(0, 10).is_empty());
        assert_eq!(recent.after(10, 1)[0].seq, 11);
    }
}
