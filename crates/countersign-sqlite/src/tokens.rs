//! Bearer tokens, kept only as hashes, and their raw copies for `migrate-data`.

use countersign_core::{Timestamp, TokenRecord};
use countersign_store::StoreError;
use countersign_store::rows::{EventRow, TokenRow};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::{db_err, is_unique_violation};
use crate::events;

const COLUMNS: &str = "id, hash, name, role, created_at, revoked_at";

pub(crate) fn insert(
    conn: &Connection,
    token: &TokenRow,
    event: &EventRow,
) -> Result<(), StoreError> {
    // Checked first for a precise message; the constraints below are the guarantee.
    let clash: Option<String> = conn
        .prepare_cached("SELECT id FROM tokens WHERE id = ?1 OR hash = ?2")
        .and_then(|mut stmt| {
            stmt.query_row(params![token.id, token.hash], |r| r.get(0))
                .optional()
        })
        .map_err(db_err("look up a token"))?;
    if clash.is_some() {
        return Err(token.duplicate(clash.as_deref()));
    }
    insert_row(conn, token, "insert a token")?;
    events::append(conn, event)?;
    Ok(())
}

/// Copies a token as it is, with no event (for `migrate-data`).
pub(crate) fn import(conn: &Connection, token: &TokenRow) -> Result<(), StoreError> {
    insert_row(conn, token, "import a token")
}

fn insert_row(conn: &Connection, token: &TokenRow, op: &'static str) -> Result<(), StoreError> {
    conn.prepare_cached(&format!(
        "INSERT INTO tokens ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
    ))
    .and_then(|mut stmt| {
        stmt.execute(params![
            token.id,
            token.hash,
            token.name,
            token.role,
            token.created_at,
            token.revoked_at,
        ])
    })
    .map_err(|e| {
        if is_unique_violation(&e) {
            token.duplicate(None)
        } else {
            db_err(op)(e)
        }
    })?;
    Ok(())
}

pub(crate) fn revoke(
    conn: &Connection,
    id: &str,
    at: Timestamp,
    event: &EventRow,
) -> Result<TokenRecord, StoreError> {
    let token = by(conn, "id", id)?.ok_or_else(|| StoreError::NotFound {
        what: "token",
        id: id.to_string(),
    })?;
    if let Some(revoked_at) = token.revoked_at {
        // Reads "a revocation of token tok_… (at …) already exists".
        return Err(StoreError::Duplicate(format!(
            "a revocation of token {id} (at {revoked_at})"
        )));
    }
    conn.prepare_cached("UPDATE tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL")
        .and_then(|mut stmt| stmt.execute(params![id, at.millis()]))
        .map_err(db_err("revoke a token"))?;
    events::append(conn, event)?;
    Ok(TokenRecord {
        revoked_at: Some(at),
        ..token
    })
}

pub(crate) fn by_hash(conn: &Connection, hash: &str) -> Result<Option<TokenRecord>, StoreError> {
    by(conn, "hash", hash)
}

pub(crate) fn list(conn: &Connection) -> Result<Vec<TokenRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM tokens ORDER BY created_at, id"
        ))
        .map_err(db_err("list tokens"))?;
    let rows = stmt
        .query_map([], read)
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(db_err("list tokens"))?;
    rows.into_iter().map(TokenRow::decode).collect()
}

fn by(conn: &Connection, column: &str, value: &str) -> Result<Option<TokenRecord>, StoreError> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tokens WHERE {column} = ?1"))
        .and_then(|mut stmt| stmt.query_row([value], read).optional())
        .map_err(db_err("read a token"))?
        .map(TokenRow::decode)
        .transpose()
}

/// Reads [`COLUMNS`], before the role and the times are checked.
fn read(row: &Row<'_>) -> rusqlite::Result<TokenRow> {
    let (id, hash, name, role, created_at, revoked_at) = row.try_into()?;
    Ok(TokenRow {
        id,
        hash,
        name,
        role,
        created_at,
        revoked_at,
    })
}
