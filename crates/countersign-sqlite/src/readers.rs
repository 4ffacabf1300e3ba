//! A small pool of read-only connections. In WAL mode they read a consistent snapshot
//! beside the writer without blocking it or each other.
//!
//! Hand-rolled because the job is tiny: a fixed set of connections that never go bad (a
//! failed query leaves a SQLite connection usable), handed out behind a semaphore. The
//! pool crates for rusqlite pin their own rusqlite version, which would tie ours to
//! theirs for no gain.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_store::StoreError;
use rusqlite::Connection;
use tokio::sync::Semaphore;

use crate::error::db_err;
use crate::schema::open_reader;

pub(crate) struct Readers {
    idle: Mutex<Vec<Connection>>,
    /// One permit per connection, so a holder always finds one idle.
    permits: Arc<Semaphore>,
    path: PathBuf,
    busy_timeout: Duration,
}

impl Readers {
    pub(crate) fn open(
        path: PathBuf,
        size: usize,
        busy_timeout: Duration,
    ) -> Result<Arc<Self>, StoreError> {
        let size = size.max(1);
        let idle = (0..size)
            .map(|_| open_reader(&path, busy_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(Self {
            idle: Mutex::new(idle),
            permits: Arc::new(Semaphore::new(size)),
            path,
            busy_timeout,
        }))
    }

    /// Runs `read` on a pooled connection on tokio's blocking threads: for reads that may
    /// take a while (scans, lists, exports).
    pub(crate) async fn run<T, F>(self: &Arc<Self>, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let permit = self.permits.clone().acquire_owned().await.map_err(|_| {
            StoreError::Unavailable(format!(
                "the reader pool for {} is closed",
                self.path.display()
            ))
        })?;
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let conn = pool.take()?;
            let result = read(&conn);
            pool.put(conn);
            result
        })
        .await
        .map_err(|e| StoreError::Backend(format!("a database read did not finish: {e}")))?
    }

    /// Runs a short read (one row, or a few by key) on a pooled connection, here on the
    /// calling thread when it can.
    ///
    /// When a connection is idle, the read runs right away with SQLite told not to wait
    /// for any lock: a point read in WAL mode is then only CPU work on pages that are
    /// almost always cached, tens of microseconds, cheaper than handing it to another
    /// thread and back (two thread wake-ups, the largest cost per request under load; see
    /// docs/benchmarks.md). Only when that finds the database busy (another process
    /// recovering the WAL) or no connection idle does the read go to [`Readers::run`],
    /// where it may wait up to the busy timeout without holding up other tasks.
    pub(crate) async fn read_now<T, F>(self: &Arc<Self>, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        if let Ok(permit) = self.permits.try_acquire() {
            let conn = self.take()?;
            let inline = conn.busy_timeout(Duration::ZERO).map(|()| {
                let result = read(&conn);
                // Restored for the blocking path, which may be this connection's next use.
                conn.busy_timeout(self.busy_timeout).map(|()| result)
            });
            self.put(conn);
            drop(permit);
            match inline.and_then(|restored| restored) {
                Ok(Err(StoreError::Unavailable(_))) => {}
                Ok(result) => return result,
                Err(err) => return Err(db_err("set the busy timeout")(err)),
            }
        }
        self.run(read).await
    }

    fn take(&self) -> Result<Connection, StoreError> {
        let idle = lock(&self.idle).pop();
        match idle {
            Some(conn) => Ok(conn),
            // Only if a read panicked and its connection was lost: replace it.
            None => open_reader(&self.path, self.busy_timeout),
        }
    }

    fn put(&self, conn: Connection) {
        lock(&self.idle).push(conn);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A Vec of connections stays consistent even if a holder panicked.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread::{self, ThreadId};

    use super::*;

    fn pool(size: usize) -> (Arc<Readers>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (7);")
            .unwrap();
        (
            Readers::open(path, size, Duration::from_secs(5)).unwrap(),
            dir,
        )
    }

    fn value(conn: &Connection) -> Result<(i64, ThreadId), StoreError> {
        let x = conn
            .query_row("SELECT x FROM t", [], |r| r.get(0))
            .map_err(db_err("read t"))?;
        Ok((x, thread::current().id()))
    }

    #[tokio::test]
    async fn a_short_read_runs_on_the_calling_thread() {
        let (readers, _dir) = pool(2);
        let (x, on) = readers.read_now(value).await.unwrap();
        assert_eq!(x, 7);
        assert_eq!(on, thread::current().id());
        // A long read always goes to a blocking thread.
        let (_, on) = readers.run(value).await.unwrap();
        assert_ne!(on, thread::current().id());
    }

    #[tokio::test]
    async fn a_busy_short_read_is_retried_where_it_may_wait() {
        let (readers, _dir) = pool(1);
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let (x, on) = readers
            .read_now(move |conn| {
                if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                    // What SQLite says when another process holds the lock.
                    return Err(StoreError::Unavailable("database is locked".into()));
                }
                value(conn)
            })
            .await
            .unwrap();
        assert_eq!((x, calls.load(Ordering::SeqCst)), (7, 2));
        assert_ne!(
            on,
            thread::current().id(),
            "the retry runs on a blocking thread"
        );
        // Other errors are not retried.
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let err = readers
            .read_now(move |_| -> Result<(), StoreError> {
                counted.fetch_add(1, Ordering::SeqCst);
                Err(StoreError::Corrupt("bad row".into()))
            })
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn with_no_idle_connection_a_short_read_waits_its_turn_elsewhere() {
        let (readers, _dir) = pool(1);
        let held = readers.permits.clone().acquire_owned().await.unwrap();
        let reading = {
            let readers = readers.clone();
            tokio::spawn(async move { readers.read_now(value).await })
        };
        tokio::task::yield_now().await;
        assert!(!reading.is_finished());
        drop(held);
        let (x, on) = reading.await.unwrap().unwrap();
        assert_eq!(x, 7);
        assert_ne!(on, thread::current().id());
    }
}
