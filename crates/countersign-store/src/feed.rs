//! The change feed: one ordered stream of stored events that every push in countersign
//! is built on (waiting agents, live views, outbound notifications).
//!
//! Every change is an event row written in the same transaction as the change, so the
//! feed only has to read events in sequence order. It reads when poked (a write in this
//! process, or a backend's notification from another process) and, as a fallback, every
//! `poll_interval`, which bounds how late a change made by another process is seen.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, broadcast, watch};
use tokio::task::JoinHandle;

use crate::{Store, StoreError, StoredEvent};

const BATCH: usize = 1000;

/// A handle to the feed; cheap to clone. The reader task stops when the last clone drops.
#[derive(Clone)]
pub struct ChangeFeed {
    inner: Arc<Inner>,
    _task: Arc<AbortOnDrop>,
}

struct Inner {
    poke: Notify,
    events: broadcast::Sender<Arc<StoredEvent>>,
    watchers: Mutex<HashMap<String, Watcher>>,
    cursor: AtomicU64,
    /// Woken whenever the cursor advances.
    advanced: Notify,
}

struct Watcher {
    tx: watch::Sender<u64>,
    count: usize,
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ChangeFeed {
    /// Starts reading after the newest event already stored.
    pub async fn start(store: Arc<dyn Store>, poll_interval: Duration) -> Result<Self, StoreError> {
        let start = store.last_event_seq().await?;
        let (events, _) = broadcast::channel(4096);
        let inner = Arc::new(Inner {
            poke: Notify::new(),
            events,
            watchers: Mutex::new(HashMap::new()),
            cursor: AtomicU64::new(start),
            advanced: Notify::new(),
        });
        let weak = Arc::downgrade(&inner);
        store
            .listen(Arc::new(move || {
                if let Some(inner) = weak.upgrade() {
                    inner.poke.notify_one();
                }
            }))
            .await?;
        let task = tokio::spawn(run(Arc::downgrade(&inner), store, poll_interval));
        Ok(Self {
            inner,
            _task: Arc::new(AbortOnDrop(task)),
        })
    }

    /// Asks the reader to look for new events now (after a local write, or when a
    /// backend signals one from elsewhere).
    pub fn poke(&self) {
        self.inner.poke.notify_one();
    }

    /// Watches one request: the returned handle wakes on every event about it.
    /// Register the watch *before* reading the request's state, then read, then wait:
    /// a change committed after the read is then always seen.
    pub fn watch(&self, request_id: &str) -> Watch {
        let mut watchers = lock(&self.inner.watchers);
        let watcher = watchers
            .entry(request_id.to_string())
            .or_insert_with(|| Watcher {
                tx: watch::channel(0).0,
                count: 0,
            });
        watcher.count += 1;
        let rx = watcher.tx.subscribe();
        Watch {
            inner: self.inner.clone(),
            request_id: request_id.to_string(),
            rx,
        }
    }

    /// Every event, in order, for live views. A receiver that falls too far behind gets
    /// `Lagged` and should reload its state.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<StoredEvent>> {
        self.inner.events.subscribe()
    }

    /// The sequence number of the last event dispatched.
    pub fn cursor(&self) -> u64 {
        self.inner.cursor.load(Ordering::Acquire)
    }

    /// Waits until the feed has dispatched event `seq` or `timeout` passes; returns
    /// whether it got there.
    pub async fn wait_for_seq(&self, seq: u64, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let advanced = self.inner.advanced.notified();
            if self.cursor() >= seq {
                return true;
            }
            self.poke();
            if tokio::time::timeout_at(deadline, advanced).await.is_err() {
                return self.cursor() >= seq;
            }
        }
    }

    /// How many requests have at least one watcher (for health and benchmarks).
    pub fn watched_requests(&self) -> usize {
        lock(&self.inner.watchers).len()
    }
}

/// A registration for the events of one request.
pub struct Watch {
    inner: Arc<Inner>,
    request_id: String,
    rx: watch::Receiver<u64>,
}

impl Watch {
    /// Resolves at the next event about the request (or at once if one arrived since the
    /// last call). Pending forever if the feed stops, so always wait with a timeout.
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut watchers = lock(&self.inner.watchers);
        if let Some(watcher) = watchers.get_mut(&self.request_id) {
            watcher.count -= 1;
            if watcher.count == 0 {
                watchers.remove(&self.request_id);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps guarded here stay consistent even if a holder panicked.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn run(inner: std::sync::Weak<Inner>, store: Arc<dyn Store>, poll_interval: Duration) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        tokio::select! {
            _ = strong.poke.notified() => {}
            _ = tokio::time::sleep(poll_interval) => {}
        }
        loop {
            let cursor = strong.cursor.load(Ordering::Acquire);
            let page = match store.follow_events(cursor, BATCH).await {
                Ok(page) => page,
                Err(err) => {
                    tracing::warn!(%err, "change feed could not read events; retrying");
                    break;
                }
            };
            // This process's own events, and no other process committed since the last
            // read: nothing more to read (the store's signal or the poll says otherwise).
            let caught_up = page.caught_up(BATCH) || (!page.read && !store.changed_elsewhere());
            for stored in page.events {
                dispatch(&strong, stored);
            }
            strong.advanced.notify_waiters();
            if caught_up {
                break;
            }
        }
        drop(strong);
    }
}

fn dispatch(inner: &Inner, stored: StoredEvent) {
    let seq = stored.seq;
    if let Some(request_id) = stored.entry.subject.as_deref()
        && let Some(watcher) = lock(&inner.watchers).get(request_id)
    {
        watcher.tx.send_replace(seq);
    }
    let _ = inner.events.send(Arc::new(stored));
    inner.cursor.store(seq, Ordering::Release);
}
