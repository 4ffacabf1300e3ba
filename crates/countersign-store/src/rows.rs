//! How the stored things become plain column values (integers, text, bytes) and back,
//! once for every SQL backend, so that SQLite and PostgreSQL cannot drift apart in what
//! they store or in what they call corrupt. The SQL and the driver's parameter binding
//! stay in each backend.
//!
//! Rows are encoded on the caller's task, not on the writer's: the writer is shared by
//! every caller, and JSON serialized there would serialize the callers too. Decoding
//! takes a row's raw values; any value that does not decode is [`StoreError::Corrupt`].

use std::fmt::Display;

use countersign_core::merkle::{Hash, NodeId};
use countersign_core::{
    ApprovalRequest, LogEntry, PayloadOpening, Role, SealedEvent, SealedTransition, Timestamp,
    TokenRecord,
};

use crate::{Doc, RequestQuery, StoreError, StoredCheckpoint, StoredEvent};

/// A stored value that does not decode: a bug or outside tampering, never retryable.
pub fn corrupt(what: impl Display, err: impl Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {err}"))
}

/// A value that cannot be encoded for storage.
fn encode_err(what: impl Display, err: impl Display) -> StoreError {
    StoreError::Backend(format!("could not encode {what}: {err}"))
}

/// Converts a count, a limit or a sequence number to SQL's 64-bit integer, saturating:
/// a limit or a cursor beyond `i64` means "everything".
pub fn to_sql_int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// A stored integer that must not be negative (a sequence number, a size, a version).
pub fn to_u64(what: &str, n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| corrupt(what, format!("{n} is negative")))
}

/// A stored time, in milliseconds since the epoch.
pub fn timestamp(what: &str, millis: i64) -> Result<Timestamp, StoreError> {
    Timestamp::from_millis(millis).ok_or_else(|| corrupt(what, format!("{millis} is not a time")))
}

/// A version as stored: versions beyond `i64` are refused, not wrapped.
fn version(what: impl FnOnce() -> String, version: u64) -> Result<i64, StoreError> {
    i64::try_from(version).map_err(|_| {
        StoreError::Backend(format!(
            "{} has version {version}, beyond what can be stored",
            what()
        ))
    })
}

/// A request's columns: the ones it is queried by, and its whole self as JSON (`body`).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRow {
    pub id: String,
    pub version: i64,
    pub status: &'static str,
    pub requested_by: String,
    pub idempotency_key: Option<String>,
    pub requested_at: i64,
    pub expires_at: i64,
    pub body: String,
}

impl RequestRow {
    pub fn of(request: &ApprovalRequest) -> Result<Self, StoreError> {
        let name = || format!("request {}", request.id);
        Ok(Self {
            id: request.id.clone(),
            version: version(name, request.version)?,
            status: request.status.as_str(),
            requested_by: request.requested_by.id.clone(),
            idempotency_key: request.idempotency_key.clone(),
            requested_at: request.requested_at.millis(),
            expires_at: request.expires_at.millis(),
            body: serde_json::to_string(request).map_err(|e| encode_err(name(), e))?,
        })
    }
}

/// A request read back from its stored `body`.
pub fn decode_request(body: &str) -> Result<ApprovalRequest, StoreError> {
    serde_json::from_str(body).map_err(|e| corrupt("a stored request", e))
}

/// The filters of a request listing: a `WHERE` clause (empty when nothing is filtered)
/// whose placeholders `placeholder` writes (`?1`, `$1`, …, numbered from 1), and the
/// text each placeholder stands for. Only the filters asked for go into the SQL, so that
/// each shape of query can use its index; the `LIMIT` is the caller's, numbered next.
pub fn request_filter(
    query: &RequestQuery,
    placeholder: impl Fn(usize) -> String,
) -> (String, Vec<String>) {
    let asked = [
        ("status", query.status.map(|s| s.as_str().to_string())),
        ("requested_by", query.requested_by.clone()),
    ];
    let mut filters = Vec::new();
    let mut values = Vec::new();
    for (column, value) in asked {
        if let Some(value) = value {
            values.push(value);
            filters.push(format!("{column} = {}", placeholder(values.len())));
        }
    }
    if filters.is_empty() {
        (String::new(), values)
    } else {
        (format!("WHERE {}", filters.join(" AND ")), values)
    }
}

/// A transition ready to write: the request's new columns and its event's.
#[derive(Debug, Clone, PartialEq)]
pub struct TransitionRow {
    pub request: RequestRow,
    pub event: EventRow,
}

impl TransitionRow {
    pub fn of(transition: &SealedTransition) -> Result<Self, StoreError> {
        Ok(Self {
            request: RequestRow::of(&transition.request)?,
            event: EventRow::of(&transition.event)?,
        })
    }
}

/// An event ready to append; its number is the backend's to give. `salt` and `payload`
/// (JSON) are the payload's opening, both set or both unset, kept in a table of their
/// own so that they can be erased without touching the entry.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub at: i64,
    pub kind: &'static str,
    pub subject: Option<String>,
    /// The entry's exact bytes: the Merkle leaf, and what the entry is read back from.
    pub bytes: Vec<u8>,
    pub salt: Option<String>,
    pub payload: Option<String>,
    /// The entry itself, for a backend that hands the events it committed to its own
    /// change feed without reading them back.
    pub entry: countersign_core::LogEntry,
}

impl EventRow {
    pub fn of(event: &SealedEvent) -> Result<Self, StoreError> {
        let (salt, payload) = match &event.payload {
            Some(opening) => (
                Some(opening.salt.clone()),
                Some(
                    serde_json::to_string(&opening.payload)
                        .map_err(|e| encode_err("a payload", e))?,
                ),
            ),
            None => (None, None),
        };
        Ok(Self {
            at: event.entry.at.millis(),
            kind: event.entry.kind.as_str(),
            subject: event.entry.subject.clone(),
            bytes: event.bytes.clone(),
            salt,
            payload,
            entry: event.entry.clone(),
        })
    }

    /// The payload's opening to store beside the event: its salt and its JSON.
    pub fn opening(&self) -> Option<(&str, &str)> {
        self.salt.as_deref().zip(self.payload.as_deref())
    }
}

/// An event read back from its number and its stored bytes.
pub fn decode_event(seq: i64, bytes: Vec<u8>) -> Result<StoredEvent, StoreError> {
    let entry: LogEntry =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("log entry {seq}"), e))?;
    Ok(StoredEvent {
        seq: to_u64("an event's number", seq)?,
        entry,
        bytes,
    })
}

/// A payload opening read back: the number of its event, and the opening.
pub fn decode_payload(
    seq: i64,
    salt: String,
    payload: &str,
) -> Result<(u64, PayloadOpening), StoreError> {
    let payload =
        serde_json::from_str(payload).map_err(|e| corrupt(format!("payload {seq}"), e))?;
    Ok((
        to_u64("a payload's number", seq)?,
        PayloadOpening { salt, payload },
    ))
}

/// A token's columns, in the order backends select them: id, hash, name, role,
/// created_at, revoked_at, expires_at, scopes. Encoded with [`TokenRow::of`], read back
/// with [`TokenRow::decode`], which checks the role, the times and the scopes.
///
/// Backends also store [`TokenRow::name_key`] in a unique column, so that no two tokens
/// ever share a name; tokens that shared one before names were unique keep theirs, and
/// only the oldest of them holds the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    pub id: String,
    pub hash: String,
    pub name: String,
    pub role: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    pub expires_at: Option<i64>,
    /// The scopes, comma-separated; `None` for all of the role's.
    pub scopes: Option<String>,
}

/// What a new token clashed with, when the backend knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenClash<'a> {
    /// A token with this id or this hash (the id of the token that holds it).
    IdOrHash(&'a str),
    /// A token with this name, ignoring case (its id).
    Name(&'a str),
}

impl TokenRow {
    pub fn of(token: &TokenRecord) -> Self {
        Self {
            id: token.id.clone(),
            hash: token.hash.clone(),
            name: token.name.clone(),
            role: token.role.as_str().to_string(),
            created_at: token.created_at.millis(),
            revoked_at: token.revoked_at.map(|t| t.millis()),
            expires_at: token.expires_at.map(|t| t.millis()),
            scopes: token.scopes.as_ref().map(|s| s.to_text()),
        }
    }

    /// The value of the unique name column.
    pub fn name_key(&self) -> String {
        countersign_core::token::name_key(&self.name)
    }

    /// The refusal of a new token whose id, hash or name is taken.
    pub fn duplicate(&self, clash: Option<TokenClash<'_>>) -> StoreError {
        StoreError::Duplicate(match clash {
            Some(TokenClash::Name(existing)) => format!(
                "a token named {:?} ({existing}; names are never reused, even after revocation)",
                self.name
            ),
            Some(TokenClash::IdOrHash(existing)) if existing != self.id => {
                format!("a token with the same hash ({existing})")
            }
            _ => format!("token {}", self.id),
        })
    }

    pub fn decode(self) -> Result<TokenRecord, StoreError> {
        let what = format!("token {}", self.id);
        Ok(TokenRecord {
            role: self.role.parse::<Role>().map_err(|e| corrupt(&what, e))?,
            created_at: timestamp(&what, self.created_at)?,
            revoked_at: self.revoked_at.map(|ms| timestamp(&what, ms)).transpose()?,
            expires_at: self.expires_at.map(|ms| timestamp(&what, ms)).transpose()?,
            scopes: self
                .scopes
                .as_deref()
                .map(countersign_core::Scopes::parse_list)
                .transpose()
                .map_err(|e| corrupt(&what, e))?,
            id: self.id,
            hash: self.hash,
            name: self.name,
        })
    }
}

/// A document's columns, in the order backends select them: kind, id, version, key,
/// body (JSON), updated_at. Encoded with [`DocRow::of`], read back with
/// [`DocRow::decode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocRow {
    pub kind: String,
    pub id: String,
    pub version: i64,
    pub key: Option<String>,
    pub body: String,
    pub updated_at: i64,
}

impl DocRow {
    pub fn of(doc: &Doc) -> Result<Self, StoreError> {
        let name = || format!("document {}/{}", doc.kind, doc.id);
        Ok(Self {
            kind: doc.kind.clone(),
            id: doc.id.clone(),
            version: version(name, doc.version)?,
            key: doc.key.clone(),
            body: serde_json::to_string(&doc.body).map_err(|e| encode_err(name(), e))?,
            updated_at: doc.updated_at.millis(),
        })
    }

    pub fn decode(self) -> Result<Doc, StoreError> {
        let what = format!("document {}/{}", self.kind, self.id);
        Ok(Doc {
            version: to_u64(&what, self.version)?,
            body: serde_json::from_str(&self.body).map_err(|e| corrupt(&what, e))?,
            updated_at: timestamp(&what, self.updated_at)?,
            kind: self.kind,
            id: self.id,
            key: self.key,
        })
    }

    /// The refusal of a write whose id or key is taken within its kind; `clash` is the
    /// id of the document that holds it, when the backend knows.
    pub fn duplicate(&self, clash: Option<&str>) -> StoreError {
        let Self { kind, id, key, .. } = self;
        StoreError::Duplicate(match (clash, key) {
            (Some(other), Some(key)) if other != id => format!("{kind} with key {key} ({other})"),
            (Some(_), _) | (None, None) => format!("{kind} {id}"),
            (None, Some(key)) => format!("{kind} with id {id} or key {key}"),
        })
    }

    /// The refusal of an update that found the stored document at `current` rather than
    /// at the version before this one.
    pub fn conflict(&self, current: impl Display) -> StoreError {
        StoreError::Conflict(format!(
            "{} {} (now version {current}, not {})",
            self.kind,
            self.id,
            self.version - 1
        ))
    }

    /// The refusal of an update of a document that does not exist.
    pub fn not_found(&self) -> StoreError {
        StoreError::NotFound {
            what: "document",
            id: format!("{}/{}", self.kind, self.id),
        }
    }
}

/// A checkpoint read back from its columns.
pub fn decode_checkpoint(size: i64, note: String, at: i64) -> Result<StoredCheckpoint, StoreError> {
    Ok(StoredCheckpoint {
        size: to_u64("a checkpoint's size", size)?,
        note,
        created_at: timestamp("a checkpoint's time", at)?,
    })
}

/// The integrated tree size from its setting (kept as text beside the log's origin); 0
/// when it was never set.
pub fn decode_integrated_size(value: Option<String>) -> Result<u64, StoreError> {
    match value {
        None => Ok(0),
        Some(text) => text
            .parse()
            .map_err(|e| corrupt("the integrated log size", e)),
    }
}

/// A Merkle node read back from its level, index and hash.
pub fn decode_node(level: i64, index: i64, hash: Vec<u8>) -> Result<(NodeId, Hash), StoreError> {
    let what = || format!("Merkle node {level}/{index}");
    let level = u8::try_from(level).map_err(|_| corrupt(what(), "level out of range"))?;
    let id = NodeId::new(level, to_u64(&what(), index)?);
    Ok((id, node_hash(id, hash)?))
}

/// The hash of node `id` from its stored bytes.
pub fn node_hash(id: NodeId, hash: Vec<u8>) -> Result<Hash, StoreError> {
    hash.try_into().map_err(|_| {
        corrupt(
            format!("Merkle node {}/{}", id.level, id.index),
            "not 32 bytes",
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn doc() -> Doc {
        Doc {
            kind: "account".into(),
            id: "u1".into(),
            version: 3,
            key: Some("alice".into()),
            body: json!({"name": "Alice", "n": [1, 2.5, null]}),
            updated_at: Timestamp::from_millis(1_700_000_000_000).unwrap(),
        }
    }

    fn token() -> TokenRecord {
        TokenRecord {
            id: "tok_1".into(),
            name: "ci".into(),
            role: Role::Approver,
            hash: "ab".repeat(32),
            created_at: Timestamp::from_millis(1_700_000_000_000).unwrap(),
            revoked_at: Timestamp::from_millis(1_700_000_060_000),
            expires_at: Timestamp::from_millis(1_800_000_000_000),
            scopes: Some(countersign_core::Scopes::of([
                countersign_core::Scope::Decide,
                countersign_core::Scope::Verify,
            ])),
        }
    }

    fn is_corrupt(result: Result<impl std::fmt::Debug, StoreError>, says: &str) {
        match result {
            Err(StoreError::Corrupt(message)) => assert!(message.contains(says), "{message}"),
            other => panic!("expected Corrupt saying {says:?}, got {other:?}"),
        }
    }

    #[test]
    fn docs_and_tokens_read_back_as_written() {
        assert_eq!(DocRow::of(&doc()).unwrap().decode().unwrap(), doc());
        assert_eq!(TokenRow::of(&token()).decode().unwrap(), token());
        assert_eq!(
            TokenRow::of(&token()).scopes.as_deref(),
            Some("verify,decide")
        );
        let unrevoked = TokenRecord {
            revoked_at: None,
            expires_at: None,
            scopes: None,
            ..token()
        };
        assert_eq!(TokenRow::of(&unrevoked).decode().unwrap(), unrevoked);
        let named = TokenRow {
            name: "Deploy-Bot".into(),
            ..TokenRow::of(&token())
        };
        assert_eq!(named.name_key(), "deploy-bot");
    }

    #[test]
    fn a_bad_row_is_corrupt() {
        let row = DocRow::of(&doc()).unwrap();
        let negative = DocRow {
            version: -1,
            ..row.clone()
        };
        is_corrupt(negative.decode(), "document account/u1: -1 is negative");
        let garbled = DocRow {
            body: "{".into(),
            ..row.clone()
        };
        is_corrupt(garbled.decode(), "document account/u1");
        let timeless = DocRow {
            updated_at: i64::MAX,
            ..row
        };
        is_corrupt(timeless.decode(), "is not a time");

        let unknown_role = TokenRow {
            role: "overlord".into(),
            ..TokenRow::of(&token())
        };
        is_corrupt(unknown_role.decode(), "token tok_1");
        let unknown_scope = TokenRow {
            scopes: Some("request,everything".into()),
            ..TokenRow::of(&token())
        };
        is_corrupt(unknown_scope.decode(), "unknown scope");

        is_corrupt(decode_event(1, b"not json".to_vec()), "log entry 1");
        is_corrupt(decode_payload(-2, String::new(), "null"), "-2 is negative");
        is_corrupt(decode_payload(2, String::new(), "{"), "payload 2");
        is_corrupt(decode_request("[]"), "a stored request");
        is_corrupt(decode_checkpoint(-1, String::new(), 0), "size");
        is_corrupt(decode_checkpoint(1, String::new(), i64::MIN), "time");
        is_corrupt(decode_integrated_size(Some("x".into())), "integrated");
        is_corrupt(decode_node(300, 0, vec![0; 32]), "level out of range");
        is_corrupt(decode_node(0, -1, vec![0; 32]), "Merkle node 0/-1");
        is_corrupt(
            decode_node(1, 2, vec![0; 31]),
            "Merkle node 1/2: not 32 bytes",
        );
    }

    #[test]
    fn stored_values_read_back() {
        assert_eq!(decode_integrated_size(None).unwrap(), 0);
        assert_eq!(decode_integrated_size(Some("42".into())).unwrap(), 42);
        let (id, hash) = decode_node(2, 5, vec![7; 32]).unwrap();
        assert_eq!((id, hash), (NodeId::new(2, 5), [7; 32]));
        let (seq, opening) = decode_payload(4, "salt".into(), r#"{"a":1}"#).unwrap();
        assert_eq!(seq, 4);
        assert_eq!(opening.salt, "salt");
        assert_eq!(opening.payload, json!({"a": 1}));
        let checkpoint = decode_checkpoint(9, "note".into(), 1_000).unwrap();
        assert_eq!(checkpoint.size, 9);
        assert_eq!(checkpoint.created_at.millis(), 1_000);
    }

    #[test]
    fn a_listing_filters_only_on_what_it_asks_for() {
        let dollar = |n| format!("${n}");
        let all = RequestQuery::default();
        assert_eq!(request_filter(&all, dollar), (String::new(), vec![]));
        let by = RequestQuery {
            requested_by: Some("agent:bot".into()),
            ..RequestQuery::default()
        };
        assert_eq!(
            request_filter(&by, |n| format!("?{n}")),
            ("WHERE requested_by = ?1".into(), vec!["agent:bot".into()])
        );
        let both = RequestQuery {
            status: Some(countersign_core::Status::Pending),
            ..by
        };
        assert_eq!(
            request_filter(&both, dollar),
            (
                "WHERE status = $1 AND requested_by = $2".into(),
                vec!["pending".into(), "agent:bot".into()]
            )
        );
    }

    #[test]
    fn versions_beyond_i64_are_refused_not_wrapped() {
        let too_new = Doc {
            version: u64::MAX,
            ..doc()
        };
        match DocRow::of(&too_new) {
            Err(StoreError::Backend(message)) => {
                assert!(message.contains("document account/u1"), "{message}")
            }
            other => panic!("expected a Backend error, got {other:?}"),
        }
    }

    #[test]
    fn integers_saturate_on_the_way_in() {
        assert_eq!(to_sql_int(5_usize), 5);
        assert_eq!(to_sql_int(u64::MAX), i64::MAX);
    }
}
