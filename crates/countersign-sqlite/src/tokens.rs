//! Bearer tokens, kept only as hashes, and their raw copies for `migrate-data`.

use countersign_core::{Timestamp, TokenRecord};
use countersign_store::StoreError;
use countersign_store::rows::{EventRow, TokenClash, TokenRow};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::{db_err, is_unique_violation};
use crate::events;

const COLUMNS: &str = "id, hash, name, role, created_at, revoked_at, expires_at, scopes";

pub(crate) fn insert(
    conn: &Connection,
    token: &TokenRow,
    event: &EventRow,
) -> Result<(), StoreError> {
    // Checked first for a precise message; the constraints below are the guarantee.
    let clash: Option<(String, bool)> = conn
        .prepare_cached(
            "SELECT id, id = ?1 OR hash = ?2 FROM tokens
             WHERE id = ?1 OR hash = ?2 OR name_key = ?3
             ORDER BY (id = ?1 OR hash = ?2) DESC LIMIT 1",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![token.id, token.hash, token.name_key()], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
        })
        .map_err(db_err("look up a token"))?;
    if let Some((existing, same_id_or_hash)) = &clash {
        return Err(token.duplicate(Some(if *same_id_or_hash {
            TokenClash::IdOrHash(existing)
        } else {
            TokenClash::Name(existing)
        })));
    }
    insert_row(conn, token, Some(token.name_key()), "insert a token")?;
    events::append(conn, event)?;
    Ok(())
}

/// Copies a token as it is, with no event (for `migrate-data`). A token that shared its
/// name with an older one before names were unique is copied without the name's key,
/// as the migration left it.
pub(crate) fn import(conn: &Connection, token: &TokenRow) -> Result<(), StoreError> {
    let key = token.name_key();
    let taken: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM tokens WHERE name_key = ?1)")
        .and_then(|mut stmt| stmt.query_row([&key], |r| r.get(0)))
        .map_err(db_err("look up a token's name"))?;
    insert_row(conn, token, (!taken).then_some(key), "import a token")
}

fn insert_row(
    conn: &Connection,
    token: &TokenRow,
    name_key: Option<String>,
    op: &'static str,
) -> Result<(), StoreError> {
    conn.prepare_cached(&format!(
        "INSERT INTO tokens ({COLUMNS}, name_key) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
    ))
    .and_then(|mut stmt| {
        stmt.execute(params![
            token.id,
            token.hash,
            token.name,
            token.role,
            token.created_at,
            token.revoked_at,
            token.expires_at,
            token.scopes,
            name_key,
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

/// Reads [`COLUMNS`], before the role, the times and the scopes are checked.
fn read(row: &Row<'_>) -> rusqlite::Result<TokenRow> {
    let (id, hash, name, role, created_at, revoked_at, expires_at, scopes) = row.try_into()?;
    Ok(TokenRow {
        id,
        hash,
        name,
        role,
        created_at,
        revoked_at,
        expires_at,
        scopes,
    })
}
