//! Approval requests: insert with idempotency, compare-and-swap transitions, and the
//! queries the server and the expiry sweeper need.

use countersign_core::{ApprovalRequest, SealedTransition, Status, Timestamp};
use countersign_store::{RequestQuery, StoreError};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};

use crate::error::{corrupt, db_err, encode_err, is_unique_violation, to_sql_int};
use crate::events::{self, EventRow};

/// A transition ready to write, encoded on the caller's thread rather than the writer's.
pub(crate) struct TransitionRow {
    id: String,
    version: i64,
    status: &'static str,
    requested_by: String,
    idempotency_key: Option<String>,
    requested_at: i64,
    expires_at: i64,
    body: String,
    event: EventRow,
}

impl TransitionRow {
    pub(crate) fn of(transition: &SealedTransition) -> Result<Self, StoreError> {
        let request = &transition.request;
        Ok(Self {
            id: request.id.clone(),
            version: i64::try_from(request.version).map_err(|_| {
                StoreError::Backend(format!(
                    "request {} has version {}, beyond what can be stored",
                    request.id, request.version
                ))
            })?,
            status: request.status.as_str(),
            requested_by: request.requested_by.id.clone(),
            idempotency_key: request.idempotency_key.clone(),
            requested_at: request.requested_at.millis(),
            expires_at: request.expires_at.millis(),
            body: serde_json::to_string(request)
                .map_err(|e| encode_err(&format!("request {}", request.id), e))?,
            event: EventRow::of(&transition.event)?,
        })
    }
}

/// What `insert` did.
pub(crate) enum Inserted {
    New,
    Existing(Box<ApprovalRequest>),
}

/// Inserts a new request and its event, unless its requester already used its
/// idempotency key. Runs in the writer's transaction, so the lookup and the insert cannot
/// be split by another writer, in this process or another.
pub(crate) fn insert(conn: &Connection, row: &TransitionRow) -> Result<Inserted, StoreError> {
    if let Some(key) = &row.idempotency_key {
        let existing: Option<String> = conn
            .prepare_cached(
                "SELECT body FROM requests WHERE requested_by = ?1 AND idempotency_key = ?2",
            )
            .and_then(|mut stmt| {
                stmt.query_row(params![row.requested_by, key], |r| r.get(0))
                    .optional()
            })
            .map_err(db_err("look up an idempotency key"))?;
        if let Some(body) = existing {
            return decode(&body).map(|r| Inserted::Existing(Box::new(r)));
        }
    }
    conn.prepare_cached(
        "INSERT INTO requests
             (id, version, status, requested_by, idempotency_key, requested_at, expires_at, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            row.id,
            row.version,
            row.status,
            row.requested_by,
            row.idempotency_key,
            row.requested_at,
            row.expires_at,
            row.body,
        ])
    })
    .map_err(|e| {
        if is_unique_violation(&e) {
            StoreError::Duplicate(format!("request {}", row.id))
        } else {
            db_err("insert a request")(e)
        }
    })?;
    events::append(conn, &row.event)?;
    Ok(Inserted::New)
}

/// Stores the transition if the stored version is exactly one less, with its event.
pub(crate) fn apply(conn: &Connection, row: &TransitionRow) -> Result<(), StoreError> {
    let changed = conn
        .prepare_cached(
            "UPDATE requests
             SET version = ?2, status = ?3, requested_by = ?4, idempotency_key = ?5,
                 requested_at = ?6, expires_at = ?7, body = ?8
             WHERE id = ?1 AND version = ?9",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                row.id,
                row.version,
                row.status,
                row.requested_by,
                row.idempotency_key,
                row.requested_at,
                row.expires_at,
                row.body,
                row.version - 1,
            ])
        })
        .map_err(db_err("update a request"))?;
    if changed == 0 {
        return Err(match get(conn, &row.id)? {
            Some(current) => StoreError::VersionConflict {
                current: Box::new(current),
            },
            None => StoreError::NotFound {
                what: "request",
                id: row.id.clone(),
            },
        });
    }
    events::append(conn, &row.event)?;
    Ok(())
}

pub(crate) fn get(conn: &Connection, id: &str) -> Result<Option<ApprovalRequest>, StoreError> {
    let body: Option<String> = conn
        .prepare_cached("SELECT body FROM requests WHERE id = ?1")
        .and_then(|mut stmt| stmt.query_row([id], |r| r.get(0)).optional())
        .map_err(db_err("read a request"))?;
    body.as_deref().map(decode).transpose()
}

pub(crate) fn list(
    conn: &Connection,
    query: &RequestQuery,
) -> Result<Vec<ApprovalRequest>, StoreError> {
    // Only the filters asked for go into the SQL, so each shape can use its index.
    let mut filters = Vec::new();
    let mut values = Vec::new();
    if let Some(status) = query.status {
        values.push(Value::Text(status.as_str().to_string()));
        filters.push(format!("status = ?{}", values.len()));
    }
    if let Some(requested_by) = &query.requested_by {
        values.push(Value::Text(requested_by.clone()));
        filters.push(format!("requested_by = ?{}", values.len()));
    }
    values.push(Value::Integer(to_sql_int(query.limit)));
    let filter = if filters.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", filters.join(" AND "))
    };
    let sql = format!(
        "SELECT body FROM requests {filter}
         ORDER BY requested_at DESC, id DESC LIMIT ?{}",
        values.len()
    );
    query_bodies(conn, &sql, params_from_iter(values), "list requests")
}

pub(crate) fn due_for_expiry(
    conn: &Connection,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<ApprovalRequest>, StoreError> {
    query_bodies(
        conn,
        "SELECT body FROM requests
         WHERE status = 'pending' AND expires_at <= ?1
         ORDER BY expires_at, id LIMIT ?2",
        params![now.millis(), to_sql_int(limit)],
        "find requests due for expiry",
    )
}

pub(crate) fn next_expiry(conn: &Connection) -> Result<Option<Timestamp>, StoreError> {
    let millis: Option<i64> = conn
        .prepare_cached("SELECT min(expires_at) FROM requests WHERE status = ?1")
        .and_then(|mut stmt| stmt.query_row([Status::Pending.as_str()], |r| r.get(0)))
        .map_err(db_err("find the next expiry"))?;
    millis
        .map(|ms| {
            Timestamp::from_millis(ms)
                .ok_or_else(|| corrupt("a request's expiry", format!("{ms} is not a time")))
        })
        .transpose()
}

fn query_bodies(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    op: &'static str,
) -> Result<Vec<ApprovalRequest>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(db_err(op))?;
    let bodies = stmt
        .query_map(params, |r| r.get::<_, String>(0))
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(db_err(op))?;
    bodies.iter().map(|body| decode(body)).collect()
}

fn decode(body: &str) -> Result<ApprovalRequest, StoreError> {
    serde_json::from_str(body).map_err(|e| corrupt("a stored request", e))
}
