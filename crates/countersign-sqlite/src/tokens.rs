//! Bearer tokens, kept only as hashes.

use countersign_core::{Role, Timestamp, TokenRecord};
use countersign_store::StoreError;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::{corrupt, db_err, is_unique_violation};
use crate::events::{self, EventRow};

const COLUMNS: &str = "id, hash, name, role, created_at, revoked_at";

pub(crate) fn insert(
    conn: &Connection,
    token: &TokenRecord,
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
    if let Some(existing) = clash {
        return Err(StoreError::Duplicate(if existing == token.id {
            format!("token {}", token.id)
        } else {
            format!("a token with the same hash ({existing})")
        }));
    }
    conn.prepare_cached(
        "INSERT INTO tokens (id, hash, name, role, created_at, revoked_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            token.id,
            token.hash,
            token.name,
            token.role.as_str(),
            token.created_at.millis(),
            token.revoked_at.map(|t| t.millis()),
        ])
    })
    .map_err(|e| {
        if is_unique_violation(&e) {
            StoreError::Duplicate(format!("token {}", token.id))
        } else {
            db_err("insert a token")(e)
        }
    })?;
    events::append(conn, event)?;
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
        .query_map([], RawToken::read)
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(db_err("list tokens"))?;
    rows.into_iter().map(RawToken::decode).collect()
}

fn by(conn: &Connection, column: &str, value: &str) -> Result<Option<TokenRecord>, StoreError> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tokens WHERE {column} = ?1"))
        .and_then(|mut stmt| stmt.query_row([value], RawToken::read).optional())
        .map_err(db_err("read a token"))?
        .map(RawToken::decode)
        .transpose()
}

/// A row as stored, before its role and times are checked.
struct RawToken {
    id: String,
    hash: String,
    name: String,
    role: String,
    created_at: i64,
    revoked_at: Option<i64>,
}

impl RawToken {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            hash: row.get(1)?,
            name: row.get(2)?,
            role: row.get(3)?,
            created_at: row.get(4)?,
            revoked_at: row.get(5)?,
        })
    }

    fn decode(self) -> Result<TokenRecord, StoreError> {
        let what = || format!("token {}", self.id);
        let time = |ms: i64| {
            Timestamp::from_millis(ms).ok_or_else(|| corrupt(what(), format!("{ms} is not a time")))
        };
        Ok(TokenRecord {
            role: self.role.parse::<Role>().map_err(|e| corrupt(what(), e))?,
            created_at: time(self.created_at)?,
            revoked_at: self.revoked_at.map(time).transpose()?,
            id: self.id,
            hash: self.hash,
            name: self.name,
        })
    }
}
