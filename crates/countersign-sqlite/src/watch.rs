//! Change notifications across processes sharing one database file.
//!
//! A `countersign mcp` stdio process waits on the same SQLite file that `serve` writes.
//! Without a signal it would see a decision only at its change feed's next poll. So each
//! process's writer, once a batch has committed, writes one byte to the database's
//! `-poke` file beside it, and every process watches that file (inotify on Linux,
//! FSEvents or kqueue elsewhere): a write to it wakes the feed.
//!
//! The `-wal` file changes at every commit too, but watching it (or the directory) wakes
//! a busy server for every page its own writer writes: thousands of events a second,
//! each read, matched and passed on by two threads, a twentieth of the process's CPU
//! under load. The poke file changes once per commit. A process running a release from
//! before the poke file is still seen, at its readers' next poll of the feed.
//!
//! Each writer writes its own token (8 bytes, random per store) and its own watcher
//! ignores a change that leaves its token there: a process's own commits reach its feed
//! directly, after the commit, and a wake-up from the file too would only make the feed
//! read early, while the commit's events are visible but before the writer has handed
//! them over (recent.rs). When two processes write the file close together, the later
//! token hides the earlier change; the feed still reads the earlier process's events
//! after the later one's, or at its next poll.
//!
//! Each burst of events is followed by a few more wake-ups over the next milliseconds,
//! for a commit whose WAL index another process is still updating; the change feed's
//! poll still catches anything later than that.

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

/// The file every process writes to after its commits, beside the database.
pub(crate) fn poke_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-poke");
    PathBuf::from(name)
}

/// Opens the poke file for reading and writing, creating it (mode 0600, like the
/// database) if needed.
fn open_poke(db: &Path) -> std::io::Result<std::fs::File> {
    let mut file = std::fs::OpenOptions::new();
    file.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut file, 0o600);
    file.open(poke_path(db))
}

/// This store's token in the poke file.
pub(crate) type Token = [u8; 8];

/// A token no other store is likely to have: the process, the time, and a counter.
pub(crate) fn new_token() -> Token {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = nanos
        ^ (u64::from(std::process::id()) << 40)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    mixed.to_le_bytes()
}

/// The writer's end: writes this store's token after each commit.
pub(crate) struct Poker {
    file: std::fs::File,
    token: Token,
}

impl Poker {
    pub(crate) fn open(db: &Path, token: Token) -> std::io::Result<Self> {
        Ok(Self {
            file: open_poke(db)?,
            token,
        })
    }

    /// Signals a commit to the other processes' watchers.
    pub(crate) fn poke(&self) {
        #[cfg(unix)]
        let _ = std::os::unix::fs::FileExt::write_at(&self.file, &self.token, 0);
    }
}

/// Whether the poke file holds `token`: the last change was this store's own.
#[cfg(unix)]
fn ours(file: &std::fs::File, token: &Token) -> bool {
    let mut seen = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(file, &mut seen, 0).is_ok() && seen == *token
}

#[cfg(not(unix))]
fn ours(_: &std::fs::File, _: &Token) -> bool {
    false
}

pub(crate) fn start(
    db: &Path,
    token: Token,
    recent: std::sync::Arc<crate::recent::Recent>,
    on_change: ChangeCallback,
) -> Result<DbWatch, StoreError> {
    let poke = poke_path(db);
    let cannot = |e: &dyn std::fmt::Display| {
        StoreError::Backend(format!("cannot watch {}: {e}", poke.display()))
    };
    // The writer creates it too; a process that only reads may be first.
    let file = open_poke(db).map_err(|e| cannot(&e))?;
    let (tx, rx) = mpsc::channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && matches!(event.kind, EventKind::Modify(_) | EventKind::Create(_))
            && !ours(&file, &token)
        {
            recent.foreign_commit();
            let _ = tx.send(());
        }
    })
    .map_err(|e| cannot(&e))?;
    watcher
        .watch(&poke, RecursiveMode::NonRecursive)
        .map_err(|e| cannot(&e))?;
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
