//! An online, consistent copy of the database while other processes write to it: SQLite's
//! backup API, copying every page in one step, which holds one read transaction for the
//! whole copy (in WAL mode a reader never blocks the writer, and sees one snapshot).

use std::path::Path;
use std::time::Duration;

use countersign_store::StoreError;
use rusqlite::backup::Backup;
use rusqlite::{Connection, OpenFlags};

use crate::error::db_err;
use crate::schema;

/// What a backup copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// The database's pages, as copied.
    pub pages: u64,
    /// The events in the copy (its log's size once integrated).
    pub events: u64,
    /// The schema version of the copy.
    pub schema_version: i64,
}

/// Copies the database at `source` to a new file `dest` (which must not exist), as one
/// consistent snapshot, durable (fsynced) when this returns. The copy is a plain
/// rollback-journal file (`journal_mode=DELETE`), a single file to carry; countersign
/// switches it back to WAL when it opens it.
pub fn backup_to(source: &Path, dest: &Path) -> Result<Copied, StoreError> {
    if dest.exists() {
        return Err(StoreError::Duplicate(format!(
            "{} (a backup writes a new file)",
            dest.display()
        )));
    }
    let src = schema::open_reader(source, Duration::from_secs(30))?;
    let mut out = Connection::open_with_flags(
        dest,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
    )
    .map_err(db_err("create the backup file"))?;
    {
        let backup = Backup::new(&src, &mut out).map_err(db_err("start the backup"))?;
        // -1: every page in one step, so the copy is one snapshot (a copy in several
        // steps restarts whenever another connection writes).
        loop {
            match backup.step(-1).map_err(db_err("copy the database"))? {
                rusqlite::backup::StepResult::Done => break,
                rusqlite::backup::StepResult::More => continue,
                rusqlite::backup::StepResult::Busy | rusqlite::backup::StepResult::Locked => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    let copied = describe(&out)?;
    out.pragma_update(None, "journal_mode", "DELETE")
        .map_err(db_err("set the copy's journal mode"))?;
    drop(out);
    std::fs::File::open(dest)
        .and_then(|f| f.sync_all())
        .map_err(|e| StoreError::Backend(format!("could not sync {}: {e}", dest.display())))?;
    Ok(copied)
}

/// What the database at `path` holds, read without changing it: for a restore's check.
pub fn describe_file(path: &Path) -> Result<Copied, StoreError> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(db_err("open the copy"))?;
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(db_err("check the copy's integrity"))?;
    if integrity != "ok" {
        return Err(StoreError::Corrupt(format!(
            "{} fails SQLite's integrity check: {integrity}",
            path.display()
        )));
    }
    describe(&conn)
}

fn describe(conn: &Connection) -> Result<Copied, StoreError> {
    let int = |sql: &str| {
        conn.query_row(sql, [], |r| r.get::<_, i64>(0))
            .map_err(db_err("read the copy"))
    };
    Ok(Copied {
        pages: int("PRAGMA page_count")?.max(0) as u64,
        events: int("SELECT COUNT(*) FROM events")?.max(0) as u64,
        schema_version: int("PRAGMA user_version")?,
    })
}
