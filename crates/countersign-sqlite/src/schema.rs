//! Opening the database file: its permissions, each connection's settings, and the
//! migrations, which are safe when several processes start on one file at once.

use std::path::Path;
use std::time::{Duration, Instant};

use countersign_store::StoreError;
use rusqlite::{Connection, OpenFlags};

use crate::error::{db_err, is_busy};

/// Migration `i` takes the schema from version `i` to `i + 1` (`PRAGMA user_version`).
/// Never edit one that has shipped; append a new one.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_initial.sql"),
    include_str!("../migrations/0002_token_expiry_scopes_unique_names.sql"),
];

/// Room for every statement the store prepares, so hot paths never re-parse SQL.
const STATEMENT_CACHE: usize = 64;

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Creates the parent directories (0700) and the database file (0600) if missing.
///
/// The file holds token hashes and every decision, so only its owner may read it. We
/// create it ourselves, rather than let SQLite create it under the process umask,
/// because SQLite gives its `-wal` and `-shm` files the permissions of the database file:
/// one restrictive create covers all three. An existing file keeps its permissions, so an
/// operator who chose others (a shared group, say) is not overruled.
pub(crate) fn create_file(path: &Path) -> Result<(), StoreError> {
    let fail = |what: &str, at: &Path, err: std::io::Error| {
        StoreError::Backend(format!("could not {what} {}: {err}", at.display()))
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        let mut dirs = std::fs::DirBuilder::new();
        dirs.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut dirs, 0o700);
        dirs.create(parent)
            .map_err(|e| fail("create the directory", parent, e))?;
    }
    let mut file = std::fs::OpenOptions::new();
    file.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut file, 0o600);
    match file.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(fail("create the database file", path, e)),
    }
}

/// The one connection that writes: WAL, fsync on every commit, foreign keys enforced,
/// schema brought up to date.
pub(crate) fn open_writer(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| open_err(path, e))?;
    // Another process holding the write lock makes us wait up to this long, not fail.
    conn.busy_timeout(busy_timeout)
        .map_err(db_err("set the busy timeout"))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    enable_wal(&conn, path, busy_timeout)?;
    // FULL: in WAL mode, NORMAL may lose the last commits on power loss, and an
    // acknowledged decision must survive that. Group commit pays for the extra fsync.
    // temp_store = MEMORY: SQLite keeps a statement's or a savepoint's journal (the
    // pages as they were before it) in a temporary file once it passes 64 KiB: a file
    // created, written page by page and deleted for every batch that needs one, which
    // was most of the writer's system calls while every job had a savepoint. In memory
    // instead; it holds at most the pages one batch touches, none of it to be durable.
    conn.execute_batch(
        "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY;",
    )
    .map_err(db_err("configure the write connection"))?;
    migrate(&conn, path)?;
    Ok(conn)
}

/// A read-only connection for the reader pool.
pub(crate) fn open_reader(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| open_err(path, e))?;
    // Readers rarely wait in WAL mode, but may while another process recovers the WAL.
    conn.busy_timeout(busy_timeout)
        .map_err(db_err("set the busy timeout"))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// WAL lets readers (ours and other processes') run beside the writer. The mode is stored
/// in the file, so this switch happens once, by whichever process opens a new file first.
fn enable_wal(conn: &Connection, path: &Path, busy_timeout: Duration) -> Result<(), StoreError> {
    let deadline = Instant::now() + busy_timeout;
    loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |row| {
            row.get::<_, String>(0)
        }) {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(StoreError::Backend(format!(
                    "{} stayed in journal mode {mode:?}, not WAL (is it on a network file \
                     system?)",
                    path.display()
                )));
            }
            // While another process is switching a new file, SQLite reports busy at once
            // rather than calling the busy handler, so wait here instead.
            Err(err) if is_busy(&err) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(err) => return Err(db_err("switch to WAL mode")(err)),
        }
    }
}

fn open_err(path: &Path, err: rusqlite::Error) -> StoreError {
    StoreError::Backend(format!("could not open {}: {err}", path.display()))
}

/// Applies the migrations this file lacks, inside one `BEGIN IMMEDIATE` transaction.
///
/// Two processes starting together both get here; the write lock lets one in at a time,
/// and the second, reading `user_version` only once it holds the lock, finds nothing
/// left to do.
fn migrate(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(db_err("lock the database to migrate it"))?;
    let result = apply_missing(conn, path);
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = conn
        .execute_batch(end)
        .map_err(db_err("commit the migration"));
    if !conn.is_autocommit() {
        // A COMMIT that failed leaves the transaction open; never carry it forward.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result.and(ended)
}

fn apply_missing(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let current: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(db_err("read the schema version"))?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::Backend(format!(
            "{} has schema version {current}, newer than this countersign understands \
             ({SCHEMA_VERSION}); run a newer countersign",
            path.display()
        )));
    }
    for (from, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        conn.execute_batch(sql).map_err(|e| {
            StoreError::Backend(format!(
                "migrating {} from schema version {from}: {e}",
                path.display()
            ))
        })?;
    }
    if current < SCHEMA_VERSION {
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(db_err("record the schema version"))?;
        tracing::info!(
            path = %path.display(),
            from = current,
            to = SCHEMA_VERSION,
            "migrated the database"
        );
    }
    Ok(())
}
