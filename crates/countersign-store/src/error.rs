//! The one error type of every store operation, whatever the backend, so that callers
//! can tell a lost race or a retryable outage from a bug without knowing the database.

use countersign_core::ApprovalRequest;

/// Cloneable so that one failure (a commit that did not happen) can be reported to every
/// caller whose write it carried.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },

    /// The request changed since it was read: another writer won the race.
    #[error("request {} changed concurrently (now version {}, {})", .current.id, .current.version, .current.status)]
    VersionConflict { current: Box<ApprovalRequest> },

    #[error("{0} already exists")]
    Duplicate(String),

    /// A document changed since it was read (a compare-and-swap lost).
    #[error("{0} changed concurrently; reload and retry")]
    Conflict(String),

    /// The database is busy or unreachable; the operation may be retried.
    #[error("database unavailable: {0}")]
    Unavailable(String),

    /// Stored data could not be read back: a bug or outside tampering.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),

    #[error("database error: {0}")]
    Backend(String),
}
