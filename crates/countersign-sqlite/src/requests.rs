//! Approval requests: insert with idempotency, compare-and-swap transitions, the
//! queries the server and the expiry sweeper need, and the raw copies `migrate-data`
//! needs.

use countersign_core::{ApprovalRequest, Status, Timestamp};
use countersign_store::rows::{
    RequestRow, TransitionRow, decode_request, request_filter, timestamp, to_sql_int,
};
use countersign_store::{RequestQuery, StoreError};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};

use crate::error::{db_err, is_unique_violation};
use crate::events;

/// What `insert` did.
pub(crate) enum Inserted {
    New,
    Existing(Box<ApprovalRequest>),
}

/// Inserts a new request and its event, unless its requester already used its
/// idempotency key. Runs in the writer's transaction, so the lookup and the insert cannot
/// be split by another writer, in this process or another.
pub(crate) fn insert(conn: &Connection, row: &TransitionRow) -> Result<Inserted, StoreError> {
    let request = &row.request;
    if let Some(existing) = by_key(
        conn,
        &request.requested_by,
        request.idempotency_key.as_deref(),
    )? {
        return Ok(existing);
    }
    insert_row(conn, request, "insert a request")?;
    events::append(conn, &row.event)?;
    Ok(Inserted::New)
}

/// Inserts a request decided as it was created (a policy's decision, and for a call
/// the gateway forwards, its claim): its row as it ends, the created event, then each
/// following one; unless its requester already used its idempotency key.
pub(crate) fn insert_decided(
    conn: &Connection,
    created: (&str, u64, &countersign_store::rows::EventRow),
    then: &[TransitionRow],
) -> Result<Inserted, StoreError> {
    let (id, version, created) = created;
    let Some(last) = then.last() else {
        return Err(StoreError::Backend(format!(
            "request {id}: no transition follows its creation"
        )));
    };
    // As `apply` would refuse them: each must be the next version of that request.
    let mut expected = version;
    for next in then {
        let request = &next.request;
        expected = expected.saturating_add(1);
        if request.id != id || u64::try_from(request.version).ok() != Some(expected) {
            return Err(StoreError::Backend(format!(
                "the transition of {} (version {}) does not follow {id} (version {})",
                request.id,
                request.version,
                expected - 1
            )));
        }
    }
    let request = &last.request;
    let key = request.idempotency_key.as_deref();
    if let Some(existing) = by_key(conn, &request.requested_by, key)? {
        return Ok(existing);
    }
    insert_row(conn, request, "insert a request")?;
    events::append(conn, created)?;
    for next in then {
        events::append(conn, &next.event)?;
    }
    Ok(Inserted::New)
}

/// The request `requested_by` made with idempotency key `key`, if any.
fn by_key(
    conn: &Connection,
    requested_by: &str,
    key: Option<&str>,
) -> Result<Option<Inserted>, StoreError> {
    let Some(key) = key else {
        return Ok(None);
    };
    let existing: Option<String> = conn
        .prepare_cached(
            "SELECT body FROM requests WHERE requested_by = ?1 AND idempotency_key = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![requested_by, key], |r| r.get(0))
                .optional()
        })
        .map_err(db_err("look up an idempotency key"))?;
    existing
        .map(|body| decode_request(&body).map(|r| Inserted::Existing(Box::new(r))))
        .transpose()
}

/// Copies a request as it is, with no event (for `migrate-data`).
pub(crate) fn import(conn: &Connection, request: &RequestRow) -> Result<(), StoreError> {
    insert_row(conn, request, "import a request")
}

fn insert_row(conn: &Connection, row: &RequestRow, op: &'static str) -> Result<(), StoreError> {
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
            db_err(op)(e)
        }
    })?;
    Ok(())
}

/// Stores the transition if the stored version is exactly one less, with its event.
pub(crate) fn apply(conn: &Connection, transition: &TransitionRow) -> Result<(), StoreError> {
    let row = &transition.request;
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
    events::append(conn, &transition.event)?;
    Ok(())
}

pub(crate) fn get(conn: &Connection, id: &str) -> Result<Option<ApprovalRequest>, StoreError> {
    let body: Option<String> = conn
        .prepare_cached("SELECT body FROM requests WHERE id = ?1")
        .and_then(|mut stmt| stmt.query_row([id], |r| r.get(0)).optional())
        .map_err(db_err("read a request"))?;
    body.as_deref().map(decode_request).transpose()
}

pub(crate) fn list(
    conn: &Connection,
    query: &RequestQuery,
) -> Result<Vec<ApprovalRequest>, StoreError> {
    let (filter, values) = request_filter(query, |n| format!("?{n}"));
    let sql = format!(
        "SELECT body FROM requests {filter}
         ORDER BY requested_at DESC, id DESC LIMIT ?{}",
        values.len() + 1
    );
    let values = values
        .into_iter()
        .map(Value::Text)
        .chain([Value::Integer(to_sql_int(query.limit))]);
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

pub(crate) fn count(conn: &Connection, status: Status) -> Result<u64, StoreError> {
    let n: i64 = conn
        .prepare_cached("SELECT count(*) FROM requests WHERE status = ?1")
        .and_then(|mut stmt| stmt.query_row([status.as_str()], |r| r.get(0)))
        .map_err(db_err("count requests"))?;
    Ok(n.unsigned_abs())
}

pub(crate) fn next_expiry(conn: &Connection) -> Result<Option<Timestamp>, StoreError> {
    let millis: Option<i64> = conn
        .prepare_cached("SELECT min(expires_at) FROM requests WHERE status = ?1")
        .and_then(|mut stmt| stmt.query_row([Status::Pending.as_str()], |r| r.get(0)))
        .map_err(db_err("find the next expiry"))?;
    millis
        .map(|ms| timestamp("a request's expiry", ms))
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
    bodies.iter().map(|body| decode_request(body)).collect()
}

/// Request rows after `after` by id, as stored (for the audit).
pub(crate) fn after(
    conn: &Connection,
    after: &str,
    limit: usize,
) -> Result<Vec<countersign_store::RawRequest>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT id, version, status, requested_by, idempotency_key, requested_at,
                    expires_at, body
             FROM requests WHERE id > ?1 ORDER BY id LIMIT ?2",
        )
        .map_err(db_err("read requests"))?;
    stmt.query_map(params![after, to_sql_int(limit)], |r| {
        Ok(countersign_store::RawRequest {
            id: r.get(0)?,
            version: r.get(1)?,
            status: r.get(2)?,
            requested_by: r.get(3)?,
            idempotency_key: r.get(4)?,
            requested_at: r.get(5)?,
            expires_at: r.get(6)?,
            body: r.get(7)?,
        })
    })
    .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
    .map_err(db_err("read requests"))
}
