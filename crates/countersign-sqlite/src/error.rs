//! How SQLite's errors become [`StoreError`]s, each naming the operation that failed.

use countersign_store::StoreError;
use rusqlite::ErrorCode;

/// Maps a rusqlite error from `op` (e.g. "insert request"): a busy or locked database is
/// `Unavailable` (the caller may retry), anything else a `Backend` error.
pub(crate) fn db_err(op: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |err| {
        if is_busy(&err) {
            StoreError::Unavailable(format!(
                "{op}: the database stayed locked by another writer ({err})"
            ))
        } else {
            StoreError::Backend(format!("{op}: {err}"))
        }
    }
}

/// SQLITE_BUSY or SQLITE_LOCKED: someone else holds a lock; trying later may work.
pub(crate) fn is_busy(err: &rusqlite::Error) -> bool {
    matches!(
        err.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Whether `err` is a UNIQUE or PRIMARY KEY violation.
pub(crate) fn is_unique_violation(err: &rusqlite::Error) -> bool {
    matches!(
        err,
        rusqlite::Error::SqliteFailure(e, _)
            if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                || e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
    )
}
