//! Small documents (accounts, sessions, invitations, settings, rooms) and one-time
//! settings.

use countersign_store::rows::{DocRow, EventRow, to_sql_int};
use countersign_store::{Doc, StoreError};
use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{db_err, is_unique_violation};
use crate::events;

const COLUMNS: &str = "kind, id, version, key, body, updated_at";

/// Reads [`COLUMNS`], before the version, the body and the time are checked.
fn read(row: &rusqlite::Row<'_>) -> rusqlite::Result<DocRow> {
    let (kind, id, version, key, body, updated_at) = row.try_into()?;
    Ok(DocRow {
        kind,
        id,
        version,
        key,
        body,
        updated_at,
    })
}

pub(crate) fn get(conn: &Connection, kind: &str, id: &str) -> Result<Option<Doc>, StoreError> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM documents WHERE kind = ?1 AND id = ?2"
    ))
    .and_then(|mut stmt| stmt.query_row(params![kind, id], read).optional())
    .map_err(db_err("read a document"))?
    .map(DocRow::decode)
    .transpose()
}

pub(crate) fn by_key(conn: &Connection, kind: &str, key: &str) -> Result<Option<Doc>, StoreError> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM documents WHERE kind = ?1 AND key = ?2"
    ))
    .and_then(|mut stmt| stmt.query_row(params![kind, key], read).optional())
    .map_err(db_err("look up a document"))?
    .map(DocRow::decode)
    .transpose()
}

pub(crate) fn list(
    conn: &Connection,
    kind: &str,
    prefix: &str,
    limit: usize,
) -> Result<Vec<Doc>, StoreError> {
    select(
        conn,
        "list documents",
        "WHERE kind = ?1 AND substr(id, 1, length(?2)) = ?2 ORDER BY id LIMIT ?3",
        params![kind, prefix, to_sql_int(limit)],
    )
}

pub(crate) fn count(conn: &Connection, kind: &str) -> Result<u64, StoreError> {
    let n: i64 = conn
        .prepare_cached("SELECT count(*) FROM documents WHERE kind = ?1")
        .and_then(|mut stmt| stmt.query_row([kind], |r| r.get(0)))
        .map_err(db_err("count documents"))?;
    Ok(n.unsigned_abs())
}

pub(crate) fn list_recent(
    conn: &Connection,
    kind: &str,
    limit: usize,
) -> Result<Vec<Doc>, StoreError> {
    select(
        conn,
        "list recent documents",
        "WHERE kind = ?1 ORDER BY updated_at DESC, id DESC LIMIT ?2",
        params![kind, to_sql_int(limit)],
    )
}

/// The documents `SELECT ... FROM documents <rest>` finds.
fn select(
    conn: &Connection,
    op: &'static str,
    rest: &str,
    params: &[&dyn rusqlite::ToSql],
) -> Result<Vec<Doc>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM documents {rest}"))
        .map_err(db_err(op))?;
    let rows = stmt
        .query_map(params, read)
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(db_err(op))?;
    rows.into_iter().map(DocRow::decode).collect()
}

pub(crate) fn insert(
    conn: &Connection,
    row: &DocRow,
    event: Option<&EventRow>,
) -> Result<(), StoreError> {
    conn.prepare_cached(&format!(
        "INSERT INTO documents ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
    ))
    .and_then(|mut stmt| {
        stmt.execute(params![
            row.kind,
            row.id,
            row.version,
            row.key,
            row.body,
            row.updated_at
        ])
    })
    .map_err(|e| {
        if is_unique_violation(&e) {
            row.duplicate(None)
        } else {
            db_err("insert a document")(e)
        }
    })?;
    if let Some(event) = event {
        events::append(conn, event)?;
    }
    Ok(())
}

pub(crate) fn update(
    conn: &Connection,
    row: &DocRow,
    event: Option<&EventRow>,
) -> Result<(), StoreError> {
    let changed = conn
        .prepare_cached(
            "UPDATE documents SET version = ?3, key = ?4, body = ?5, updated_at = ?6
             WHERE kind = ?1 AND id = ?2 AND version = ?7",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                row.kind,
                row.id,
                row.version,
                row.key,
                row.body,
                row.updated_at,
                row.version - 1
            ])
        })
        .map_err(|e| {
            if is_unique_violation(&e) {
                row.duplicate(None)
            } else {
                db_err("update a document")(e)
            }
        })?;
    if changed == 0 {
        return Err(match get(conn, &row.kind, &row.id)? {
            Some(current) => row.conflict(current.version),
            None => row.not_found(),
        });
    }
    if let Some(event) = event {
        events::append(conn, event)?;
    }
    Ok(())
}

pub(crate) fn delete(conn: &Connection, kind: &str, id: &str) -> Result<bool, StoreError> {
    let n = conn
        .prepare_cached("DELETE FROM documents WHERE kind = ?1 AND id = ?2")
        .and_then(|mut stmt| stmt.execute(params![kind, id]))
        .map_err(db_err("delete a document"))?;
    Ok(n > 0)
}

pub(crate) fn delete_prefix(
    conn: &Connection,
    kind: &str,
    prefix: &str,
) -> Result<u64, StoreError> {
    if prefix.is_empty() {
        return Ok(0);
    }
    let n = conn
        .prepare_cached("DELETE FROM documents WHERE kind = ?1 AND substr(id, 1, length(?2)) = ?2")
        .and_then(|mut stmt| stmt.execute(params![kind, prefix]))
        .map_err(db_err("delete documents"))?;
    Ok(n as u64)
}

pub(crate) fn meta_set_once(
    conn: &Connection,
    key: &str,
    value: &str,
) -> Result<String, StoreError> {
    conn.prepare_cached(
        "INSERT INTO log_meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
    )
    .and_then(|mut stmt| stmt.execute(params![key, value]))
    .map_err(db_err("write a setting"))?;
    crate::log::meta(conn, key)?
        .ok_or_else(|| StoreError::Backend(format!("setting {key} vanished after being set")))
}

pub(crate) fn meta_list(
    conn: &Connection,
    prefix: &str,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT key, value FROM log_meta WHERE substr(key, 1, length(?1)) = ?1 ORDER BY key",
        )
        .map_err(db_err("read settings"))?;
    stmt.query_map(params![prefix], |r| Ok((r.get(0)?, r.get(1)?)))
        .and_then(|rows| rows.collect())
        .map_err(db_err("read settings"))
}
