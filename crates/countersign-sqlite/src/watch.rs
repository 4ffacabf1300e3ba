//! Change notifications across processes sharing one database file.
//!
//! A `countersign mcp` stdio process waits on the same SQLite file that `serve` writes.
//! Without a signal it would see a decision only at its change feed's next poll. Every
//! commit in WAL mode writes the `-wal` file, so the directory is watched (inotify on
//! Linux, FSEvents or kqueue elsewhere) and a write to the database's files wakes the feed.
//!
//! The write that raises the event can come before the commit is visible to readers (the
//! commit frame is fsynced, then the WAL index is updated through shared memory, which
//! raises no event). So each burst of events is followed by a few more wake-ups over the
//! next milliseconds; the change feed's poll still catches anything later than that.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use countersign_store::{ChangeCallback, StoreError};
use notify::{EventKind, RecursiveMode, Watcher};

/// Wake-ups after an event, in milliseconds after it: the first finds commits already
/// visible, the later ones those whose WAL index was still being updated.
const FOLLOW_UP_MS: [u64; 5] = [1, 2, 4, 8, 16];

/// Watches the database's files until dropped.
pub(crate) struct DbWatch {
    _watcher: notify::RecommendedWatcher,
}

pub(crate) fn start(db: &Path, on_change: ChangeCallback) -> Result<DbWatch, StoreError> {
    let dir = match db.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = db
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ours = move |path: &Path| {
        path.file_name()
            .map(|n| n.to_string_lossy())
            .is_some_and(|n| n == name || n.strip_prefix(name.as_str()) == Some("-wal"))
    };
    let (tx, rx) = mpsc::channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && matches!(event.kind, EventKind::Modify(_) | EventKind::Create(_))
            && event.paths.iter().any(|p| ours(p))
        {
            let _ = tx.send(());
        }
    })
    .map_err(|e| StoreError::Backend(format!("cannot watch {}: {e}", dir.display())))?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| StoreError::Backend(format!("cannot watch {}: {e}", dir.display())))?;
    std::thread::Builder::new()
        .name("countersign-sqlite-watch".into())
        .spawn(move || wake_loop(&rx, &on_change))
        .map_err(|e| StoreError::Backend(format!("cannot start the watch thread: {e}")))?;
    Ok(DbWatch { _watcher: watcher })
}

/// Turns bursts of file events into a wake-up now and a few shortly after. Ends when the
/// watcher (and with it the sender) is dropped.
fn wake_loop(rx: &mpsc::Receiver<()>, on_change: &ChangeCallback) {
    while rx.recv().is_ok() {
        on_change();
        let mut waited = 0;
        let mut i = 0;
        while i < FOLLOW_UP_MS.len() {
            let wait = Duration::from_millis(FOLLOW_UP_MS[i] - waited);
            match rx.recv_timeout(wait) {
                // More events: the burst goes on; start the follow-ups over.
                Ok(()) => {
                    on_change();
                    waited = 0;
                    i = 0;
                    while rx.try_recv().is_ok() {}
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    on_change();
                    waited = FOLLOW_UP_MS[i];
                    i += 1;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}
