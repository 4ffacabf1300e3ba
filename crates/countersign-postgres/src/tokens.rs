//! Bearer tokens, kept only as hashes.

use countersign_core::{Timestamp, TokenRecord};
use countersign_store::StoreError;
use countersign_store::rows::{EventRow, TokenClash, TokenRow};
use tokio_postgres::Row;

use crate::error::column_err;
use crate::events::{append_ctes, written_seq};
use crate::params::{Param, Params};
use crate::writer::{Decoded, Outcome};

const COLUMNS: &str = "id, hash, name, role, created_at, revoked_at, expires_at, scopes";

/// A token's columns in the order of [`COLUMNS`].
impl Params for TokenRow {
    fn params(&self) -> Vec<Param<'_>> {
        vec![
            &self.id,
            &self.hash,
            &self.name,
            &self.role,
            &self.created_at,
            &self.revoked_at,
            &self.expires_at,
            &self.scopes,
        ]
    }
}

/// A new token and its event: the event is `$1`..`$6`, the token `$7`..`$14`, its name's
/// key `$15`.
pub(crate) struct NewToken {
    token: TokenRow,
    name_key: String,
    event: EventRow,
}

impl NewToken {
    pub(crate) fn of(token: &TokenRecord, event: EventRow) -> Self {
        let token = TokenRow::of(token);
        Self {
            name_key: token.name_key(),
            token,
            event,
        }
    }

    pub(crate) fn params(&self) -> Vec<Param<'_>> {
        let mut params = self.event.params();
        params.extend(self.token.params());
        params.push(&self.name_key);
        params
    }

    pub(crate) fn decode(&self, row: &Row) -> Decoded {
        let result = (|| {
            let seq = written_seq(row)?;
            let clash: Option<String> = row
                .try_get(1)
                .map_err(column_err("a clashing token's id"))?;
            let same_id_or_hash: Option<bool> = row
                .try_get(2)
                .map_err(column_err("what a token clashes on"))?;
            Ok((seq, clash, same_id_or_hash))
        })();
        match result {
            Err(err) => Decoded::failed(err),
            Ok((Some(seq), _, _)) => Decoded::wrote(seq, Outcome::TokenCreated),
            Ok((None, clash, same)) => {
                let clash = clash.as_deref().map(|id| match same {
                    Some(false) => TokenClash::Name(id),
                    _ => TokenClash::IdOrHash(id),
                });
                Decoded::unwritten(Err(self.token.duplicate(clash)))
            }
        }
    }
}

/// Inserts the token and its event unless its id, hash or name is taken. Columns: the
/// event's number, the id of a token that clashes (one with this id or hash first), and
/// whether it clashes on the id or hash (rather than the name).
pub(crate) fn insert_sql() -> String {
    format!(
        "WITH clash AS (
            SELECT id, (id = $7::text OR hash = $8::text) AS same_id_or_hash FROM tokens
            WHERE id = $7::text OR hash = $8::text OR name_key = $15::text
            ORDER BY (id = $7::text OR hash = $8::text) DESC, id = $7::text DESC LIMIT 1
        ),
        inserted AS (
            INSERT INTO tokens ({COLUMNS}, name_key)
            SELECT $7::text, $8::text, $9::text, $10::text, $11::bigint, $12::bigint,
                   $13::bigint, $14::text, $15::text
            WHERE NOT EXISTS (SELECT 1 FROM clash)
            ON CONFLICT DO NOTHING
            RETURNING id
        ),
        {}
        SELECT (SELECT seq FROM event), (SELECT id FROM clash),
               (SELECT same_id_or_hash FROM clash)",
        append_ctes("inserted")
    )
}

/// A revocation: the event is `$1`..`$6`, the token id `$7`, the time `$8`.
pub(crate) struct Revocation {
    id: String,
    at: Timestamp,
    at_millis: i64,
    event: EventRow,
}

impl Revocation {
    pub(crate) fn new(id: &str, at: Timestamp, event: EventRow) -> Self {
        Self {
            id: id.to_string(),
            at,
            at_millis: at.millis(),
            event,
        }
    }

    pub(crate) fn params(&self) -> Vec<Param<'_>> {
        let mut params = self.event.params();
        params.extend([&self.id as Param<'_>, &self.at_millis]);
        params
    }

    pub(crate) fn decode(&self, row: &Row) -> Decoded {
        let seq = match written_seq(row) {
            Ok(seq) => seq,
            Err(err) => return Decoded::failed(err),
        };
        let token = match row.try_get::<_, Option<String>>(1) {
            Ok(None) => None,
            Ok(Some(_)) => match read(row, 1).and_then(TokenRow::decode) {
                Ok(token) => Some(token),
                Err(err) => return Decoded::failed(err),
            },
            Err(err) => return Decoded::failed(column_err("a token")(err)),
        };
        match (seq, token) {
            (Some(seq), Some(token)) => Decoded::wrote(
                seq,
                Outcome::Revoked(TokenRecord {
                    revoked_at: Some(self.at),
                    ..token
                }),
            ),
            (None, Some(token)) => match token.revoked_at {
                // Reads "a revocation of token tok_… (at …) already exists".
                Some(revoked_at) => Decoded::unwritten(Err(StoreError::Duplicate(format!(
                    "a revocation of token {} (at {revoked_at})",
                    self.id
                )))),
                None => Decoded::failed(StoreError::Backend(format!(
                    "revoke token {}: the token is not revoked, yet the update changed nothing",
                    self.id
                ))),
            },
            (None, None) => Decoded::unwritten(Err(StoreError::NotFound {
                what: "token",
                id: self.id.clone(),
            })),
            (Some(_), None) => Decoded::failed(StoreError::Backend(format!(
                "revoke token {}: an event was written for a token that does not exist",
                self.id
            ))),
        }
    }
}

/// Marks the token revoked, with its event, unless it is unknown or already revoked.
/// Columns: the event's number, then the token as it was before ([`COLUMNS`]; all NULL
/// if there is no such token).
pub(crate) fn revoke_sql() -> String {
    format!(
        "WITH current AS (
            SELECT {COLUMNS} FROM tokens WHERE id = $7::text
        ),
        revoked AS (
            UPDATE tokens SET revoked_at = $8::bigint
            WHERE id = $7::text AND revoked_at IS NULL
            RETURNING id
        ),
        {}
        SELECT (SELECT seq FROM event), c.id, c.hash, c.name, c.role, c.created_at,
               c.revoked_at, c.expires_at, c.scopes
        FROM (SELECT 1) AS one LEFT JOIN current AS c ON true",
        append_ctes("revoked")
    )
}

/// Copies a token as it is (`$1`..`$8`, its name's key `$9`), with no event, unless its
/// id or hash is taken: then it changes nothing. A token that shared its name with an
/// older one before names were unique is copied without the key, as the migration left
/// it.
pub(crate) fn import_sql() -> String {
    format!(
        "INSERT INTO tokens ({COLUMNS}, name_key)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
                 CASE WHEN EXISTS (SELECT 1 FROM tokens WHERE name_key = $9::text)
                      THEN NULL ELSE $9::text END)
         ON CONFLICT DO NOTHING"
    )
}

pub(crate) fn by_hash_sql() -> String {
    format!("SELECT {COLUMNS} FROM tokens WHERE hash = $1")
}

pub(crate) fn list_sql() -> String {
    format!("SELECT {COLUMNS} FROM tokens ORDER BY created_at, id")
}

pub(crate) fn decode_tokens(rows: &[Row]) -> Result<Vec<TokenRecord>, StoreError> {
    rows.iter()
        .map(|row| read(row, 0).and_then(TokenRow::decode))
        .collect()
}

/// Reads [`COLUMNS`] starting at column `first`, before the role and the times are
/// checked.
fn read(row: &Row, first: usize) -> Result<TokenRow, StoreError> {
    let column = column_err("a token");
    Ok(TokenRow {
        id: row.try_get(first).map_err(&column)?,
        hash: row.try_get(first + 1).map_err(&column)?,
        name: row.try_get(first + 2).map_err(&column)?,
        role: row.try_get(first + 3).map_err(&column)?,
        created_at: row.try_get(first + 4).map_err(&column)?,
        revoked_at: row.try_get(first + 5).map_err(&column)?,
        expires_at: row.try_get(first + 6).map_err(&column)?,
        scopes: row.try_get(first + 7).map_err(&column)?,
    })
}
