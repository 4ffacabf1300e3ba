//! How PostgreSQL's errors become [`StoreError`]s, each naming the operation that failed.
//!
//! - The server unreachable, the connection lost, a lock or statement timeout, a
//!   serialization failure, the server shutting down or full: `Unavailable` (retry, or
//!   try another instance).
//! - Stored data that does not decode: `Corrupt`.
//! - Anything else (bad credentials, missing privileges, a bug): `Backend`.

use countersign_store::StoreError;
use countersign_store::rows::corrupt;
use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

/// What kind of failure an error is, for the messages [`check`](crate::PostgresStore)
/// and the mapping give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Could not talk to the server at all, or lost the connection.
    Unreachable,
    /// The server refused the credentials, the role or the database.
    Refused,
    /// The server only allows reads (a standby, or read-only transactions).
    ReadOnly,
    /// Busy: a lock or statement timeout, a serialization failure, a shutdown.
    Busy,
    /// A unique constraint was violated.
    Unique,
    Other,
}

pub(crate) fn classify(err: &tokio_postgres::Error) -> Failure {
    let Some(code) = err.code() else {
        // No SQLSTATE: the error is the client's. A closed connection, an I/O error or a
        // connect timeout means the server cannot be reached; an encoding or protocol
        // error is a bug.
        if err.is_closed() || is_io(err) || err.to_string().starts_with("timeout") {
            return Failure::Unreachable;
        }
        return Failure::Other;
    };
    let class = &code.code()[..2.min(code.code().len())];
    if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        Failure::ReadOnly
    } else if *code == SqlState::UNIQUE_VIOLATION {
        Failure::Unique
    } else if class == "08" {
        Failure::Unreachable
    } else if class == "28" || *code == SqlState::INVALID_CATALOG_NAME {
        Failure::Refused
    } else if class == "40"
        || class == "53"
        || class == "57"
        || *code == SqlState::LOCK_NOT_AVAILABLE
        || *code == SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT
    {
        // 40: serialization failure or deadlock; 53: out of connections, memory or
        // disk; 57: cancelled (timeouts), shutting down, not yet accepting connections.
        Failure::Busy
    } else {
        Failure::Other
    }
}

fn is_io(err: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        if inner.is::<std::io::Error>() {
            return true;
        }
        source = inner.source();
    }
    false
}

/// The error's full text: tokio-postgres's own `Display` says only "db error" or
/// "error connecting to server", the server's message and the cause are underneath.
pub(crate) fn describe(err: &tokio_postgres::Error) -> String {
    if let Some(db) = err.as_db_error() {
        let mut text = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(detail) = db.detail() {
            text.push_str(&format!("; {detail}"));
        }
        return text;
    }
    match std::error::Error::source(err) {
        Some(source) => format!("{err}: {source}"),
        None => err.to_string(),
    }
}

/// Maps an error from `op` (e.g. "insert a request").
pub(crate) fn db_err(op: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |err| map(op, &err)
}

pub(crate) fn map(op: &str, err: &tokio_postgres::Error) -> StoreError {
    let text = describe(err);
    match classify(err) {
        Failure::Unreachable => {
            StoreError::Unavailable(format!("{op}: lost the connection to PostgreSQL ({text})"))
        }
        Failure::Busy => StoreError::Unavailable(format!("{op}: PostgreSQL is busy ({text})")),
        Failure::ReadOnly => StoreError::Unavailable(format!(
            "{op}: PostgreSQL only allows reads here, a standby or a read-only session ({text})"
        )),
        Failure::Refused | Failure::Unique | Failure::Other => {
            StoreError::Backend(format!("{op}: {text}"))
        }
    }
}

/// Maps a failure to get a pooled connection to the server at `target`.
pub(crate) fn pool_err(op: &str, target: &str, err: PoolError) -> StoreError {
    match err {
        PoolError::Backend(err) => connect_err(op, target, &err),
        PoolError::Timeout(_) => StoreError::Unavailable(format!(
            "{op}: no connection to PostgreSQL at {target} became free in time"
        )),
        PoolError::Closed => {
            StoreError::Unavailable(format!("{op}: the connection pool for {target} is closed"))
        }
        PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => {
            StoreError::Backend(format!("{op}: connection pool for {target}: {err}"))
        }
    }
}

/// Maps a failure to open a connection to the server at `target`, saying in words what
/// is wrong.
pub(crate) fn connect_err(op: &str, target: &str, err: &tokio_postgres::Error) -> StoreError {
    let text = describe(err);
    match classify(err) {
        Failure::Unreachable => StoreError::Unavailable(format!(
            "{op}: cannot reach PostgreSQL at {target} ({text})"
        )),
        Failure::Refused => StoreError::Backend(format!(
            "{op}: PostgreSQL at {target} refused the connection; check the user, password and \
             database name in the database URL ({text})"
        )),
        Failure::Busy => StoreError::Unavailable(format!(
            "{op}: PostgreSQL at {target} is not accepting connections now ({text})"
        )),
        _ => StoreError::Backend(format!(
            "{op}: connecting to PostgreSQL at {target}: {text}"
        )),
    }
}

/// A column that does not have the type the schema gives it.
pub(crate) fn column_err(what: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |err| corrupt(what, describe(&err))
}
