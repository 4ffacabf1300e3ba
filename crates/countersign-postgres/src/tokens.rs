//! Bearer tokens, kept only as hashes.

use countersign_core::{Role, Timestamp, TokenRecord};
use countersign_store::StoreError;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::error::{column_err, corrupt, timestamp};
use crate::events::{EventRow, append_ctes, written_seq};
use crate::writer::{Decoded, Outcome};

const COLUMNS: &str = "id, hash, name, role, created_at, revoked_at";

/// A token's columns ([`COLUMNS`]).
pub(crate) struct TokenRow {
    id: String,
    hash: String,
    name: String,
    role: &'static str,
    created_at: i64,
    revoked_at: Option<i64>,
}

impl TokenRow {
    pub(crate) fn of(token: &TokenRecord) -> Self {
        Self {
            id: token.id.clone(),
            hash: token.hash.clone(),
            name: token.name.clone(),
            role: token.role.as_str(),
            created_at: token.created_at.millis(),
            revoked_at: token.revoked_at.map(|t| t.millis()),
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The columns in the order of [`COLUMNS`].
    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 6] {
        [
            &self.id,
            &self.hash,
            &self.name,
            &self.role,
            &self.created_at,
            &self.revoked_at,
        ]
    }
}

/// A new token and its event: the event is `$1`..`$6`, the token `$7`..`$12`.
pub(crate) struct NewToken {
    token: TokenRow,
    event: EventRow,
}

impl NewToken {
    pub(crate) fn of(token: &TokenRecord, event: EventRow) -> Self {
        Self {
            token: TokenRow::of(token),
            event,
        }
    }

    pub(crate) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        let mut params: Vec<&(dyn ToSql + Sync)> = self.event.params().to_vec();
        params.extend_from_slice(&self.token.params());
        params
    }

    pub(crate) fn decode(&self, row: &Row) -> Decoded {
        let result = (|| {
            let seq = written_seq(row)?;
            let clash: Option<String> = row
                .try_get(1)
                .map_err(column_err("a clashing token's id"))?;
            Ok((seq, clash))
        })();
        match result {
            Err(err) => Decoded::failed(err),
            Ok((Some(seq), _)) => Decoded::wrote(seq, Outcome::TokenCreated),
            Ok((None, clash)) => Decoded::unwritten(Err(StoreError::Duplicate(match clash {
                Some(existing) if existing != self.token.id => {
                    format!("a token with the same hash ({existing})")
                }
                _ => format!("token {}", self.token.id),
            }))),
        }
    }
}

/// Inserts the token and its event unless its id or hash is taken. Columns: the event's
/// number, the id of a token that clashes (this id first).
pub(crate) fn insert_sql() -> String {
    format!(
        "WITH clash AS (
            SELECT id FROM tokens WHERE id = $7::text OR hash = $8::text
            ORDER BY id = $7::text DESC LIMIT 1
        ),
        inserted AS (
            INSERT INTO tokens (id, hash, name, role, created_at, revoked_at)
            SELECT $7::text, $8::text, $9::text, $10::text, $11::bigint, $12::bigint
            WHERE NOT EXISTS (SELECT 1 FROM clash)
            ON CONFLICT DO NOTHING
            RETURNING id
        ),
        {}
        SELECT (SELECT seq FROM event), (SELECT id FROM clash)",
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

    pub(crate) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        let mut params: Vec<&(dyn ToSql + Sync)> = self.event.params().to_vec();
        params.extend_from_slice(&[&self.id, &self.at_millis]);
        params
    }

    pub(crate) fn decode(&self, row: &Row) -> Decoded {
        let seq = match written_seq(row) {
            Ok(seq) => seq,
            Err(err) => return Decoded::failed(err),
        };
        let token = match row.try_get::<_, Option<String>>(1) {
            Ok(None) => None,
            Ok(Some(_)) => match RawToken::read(row, 1).and_then(RawToken::decode) {
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
               c.revoked_at
        FROM (SELECT 1) AS one LEFT JOIN current AS c ON true",
        append_ctes("revoked")
    )
}

/// Copies a token as it is, with no event, unless its id or hash is taken: then it
/// changes nothing.
pub(crate) fn import_sql() -> String {
    format!("INSERT INTO tokens ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING")
}

pub(crate) fn by_hash_sql() -> String {
    format!("SELECT {COLUMNS} FROM tokens WHERE hash = $1")
}

pub(crate) fn list_sql() -> String {
    format!("SELECT {COLUMNS} FROM tokens ORDER BY created_at, id")
}

pub(crate) fn decode_tokens(rows: &[Row]) -> Result<Vec<TokenRecord>, StoreError> {
    rows.iter()
        .map(|row| RawToken::read(row, 0).and_then(RawToken::decode))
        .collect()
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
    /// Reads [`COLUMNS`] starting at column `first`.
    fn read(row: &Row, first: usize) -> Result<Self, StoreError> {
        let column = column_err("a token");
        Ok(Self {
            id: row.try_get(first).map_err(&column)?,
            hash: row.try_get(first + 1).map_err(&column)?,
            name: row.try_get(first + 2).map_err(&column)?,
            role: row.try_get(first + 3).map_err(&column)?,
            created_at: row.try_get(first + 4).map_err(&column)?,
            revoked_at: row.try_get(first + 5).map_err(&column)?,
        })
    }

    fn decode(self) -> Result<TokenRecord, StoreError> {
        let what = format!("token {}", self.id);
        Ok(TokenRecord {
            role: self.role.parse::<Role>().map_err(|e| corrupt(&what, e))?,
            created_at: timestamp(&what, self.created_at)?,
            revoked_at: self.revoked_at.map(|ms| timestamp(&what, ms)).transpose()?,
            id: self.id,
            hash: self.hash,
            name: self.name,
        })
    }
}
