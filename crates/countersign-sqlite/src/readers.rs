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

    /// Runs `read` on a pooled connection on tokio's blocking threads.
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
