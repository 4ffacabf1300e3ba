//! Small documents (accounts, sessions, invitations, settings, rooms) and one-time
//! settings, plus the raw copies `migrate-data` needs.

use countersign_core::{ApprovalRequest, Timestamp, TokenRecord};
use countersign_store::{Doc, StoreError};
use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{corrupt, db_err, encode_err, is_unique_violation, to_sql_int};
use crate::events::{self, EventRow};

/// A document ready to write, encoded on the caller's thread.
pub(crate) struct DocRow {
    kind: String,
    id: String,
    version: i64,
    key: Option<String>,
    body: String,
    updated_at: i64,
}

impl DocRow {
    pub(crate) fn of(doc: &Doc) -> Result<Self, StoreError> {
        Ok(Self {
            kind: doc.kind.clone(),
            id: doc.id.clone(),
            version: i64::try_from(doc.version).map_err(|_| {
                StoreError::Backend(format!(
                    "document {} has a version too large to store",
                    doc.id
                ))
            })?,
            key: doc.key.clone(),
            body: serde_json::to_string(&doc.body).map_err(|e| encode_err("a document", e))?,
            updated_at: doc.updated_at.millis(),
        })
    }
}

const COLUMNS: &str = "kind, id, version, key, body, updated_at";

fn decode(
    row: &rusqlite::Row<'_>,
) -> rusqlite::Result<(String, String, i64, Option<String>, String, i64)> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

fn to_doc(raw: (String, String, i64, Option<String>, String, i64)) -> Result<Doc, StoreError> {
    let (kind, id, version, key, body, updated_at) = raw;
    Ok(Doc {
        body: serde_json::from_str(&body)
            .map_err(|e| corrupt(format!("document {kind}/{id}"), e))?,
        updated_at: Timestamp::from_millis(updated_at)
            .ok_or_else(|| corrupt(format!("document {kind}/{id}"), "bad time"))?,
        version: version.max(0) as u64,
        kind,
        id,
        key,
    })
}

pub(crate) fn get(conn: &Connection, kind: &str, id: &str) -> Result<Option<Doc>, StoreError> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM documents WHERE kind = ?1 AND id = ?2"
    ))
    .and_then(|mut stmt| stmt.query_row(params![kind, id], decode).optional())
    .map_err(db_err("read a document"))?
    .map(to_doc)
    .transpose()
}

pub(crate) fn by_key(conn: &Connection, kind: &str, key: &str) -> Result<Option<Doc>, StoreError> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM documents WHERE kind = ?1 AND key = ?2"
    ))
    .and_then(|mut stmt| stmt.query_row(params![kind, key], decode).optional())
    .map_err(db_err("look up a document"))?
    .map(to_doc)
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
        .query_map(params, decode)
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(db_err(op))?;
    rows.into_iter().map(to_doc).collect()
}

fn duplicate(row: &DocRow) -> StoreError {
    StoreError::Duplicate(match &row.key {
        Some(key) => format!("a {} with id {} or key {key}", row.kind, row.id),
        None => format!("a {} with id {}", row.kind, row.id),
    })
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
            duplicate(row)
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
                duplicate(row)
            } else {
                db_err("update a document")(e)
            }
        })?;
    if changed == 0 {
        return Err(match get(conn, &row.kind, &row.id)? {
            Some(current) => StoreError::Conflict(format!(
                "{} {} (now version {}, not {})",
                row.kind,
                row.id,
                current.version,
                row.version - 1
            )),
            None => StoreError::NotFound {
                what: "document",
                id: format!("{}/{}", row.kind, row.id),
            },
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

pub(crate) fn import_request(
    conn: &Connection,
    request: &ApprovalRequest,
) -> Result<(), StoreError> {
    let body = serde_json::to_string(request).map_err(|e| encode_err("a request", e))?;
    conn.prepare_cached(
        "INSERT INTO requests
             (id, version, status, requested_by, idempotency_key, requested_at, expires_at, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            request.id,
            to_sql_int(request.version),
            request.status.as_str(),
            request.requested_by.id,
            request.idempotency_key,
            request.requested_at.millis(),
            request.expires_at.millis(),
            body
        ])
    })
    .map_err(|e| {
        if is_unique_violation(&e) {
            StoreError::Duplicate(format!("request {}", request.id))
        } else {
            db_err("import a request")(e)
        }
    })?;
    Ok(())
}

pub(crate) fn import_token(conn: &Connection, token: &TokenRecord) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO tokens (id, hash, name, role, created_at, revoked_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            token.id,
            token.hash,
            token.name,
            token.role.as_str(),
            token.created_at.millis(),
            token.revoked_at.map(|t| t.millis())
        ])
    })
    .map_err(|e| {
        if is_unique_violation(&e) {
            StoreError::Duplicate(format!("token {}", token.id))
        } else {
            db_err("import a token")(e)
        }
    })?;
    Ok(())
}
