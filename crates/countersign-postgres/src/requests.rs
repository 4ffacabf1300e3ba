//! Approval requests: insert with idempotency, compare-and-swap transitions, and the
//! queries the server and the expiry sweeper need.

use countersign_core::{ApprovalRequest, Timestamp};
use countersign_store::rows::{
    RequestRow, TransitionRow, decode_request, request_filter, timestamp, to_sql_int,
};
use countersign_store::{RequestQuery, StoreError};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::error::column_err;
use crate::events::{append_ctes, written_seq};
use crate::params::{Param, Params};
use crate::writer::{Decoded, Outcome};

/// A request's columns in the order of [`IMPORT`] (and of a transition's `$7`..`$14`).
impl Params for RequestRow {
    fn params(&self) -> Vec<Param<'_>> {
        vec![
            &self.id,
            &self.version,
            &self.status,
            &self.requested_by,
            &self.idempotency_key,
            &self.requested_at,
            &self.expires_at,
            &self.body,
        ]
    }
}

/// A transition: its event is `$1`..`$6`, the request `$7`..`$14`.
impl Params for TransitionRow {
    fn params(&self) -> Vec<Param<'_>> {
        let mut params = self.event.params();
        params.extend(self.request.params());
        params
    }
}

/// What `create_request` did.
pub(crate) enum Inserted {
    New,
    Existing(Box<ApprovalRequest>),
}

/// Inserts the request and its event unless its requester already used its
/// idempotency key (then returns that request) or its id is taken (then neither
/// column is set). Columns: the event's number, the existing request.
pub(crate) fn insert_sql() -> String {
    format!(
        "WITH existing AS (
            SELECT body::text AS body FROM requests
            WHERE requested_by = $10::text AND idempotency_key = $11::text
        ),
        inserted AS (
            INSERT INTO requests
                (id, version, status, requested_by, idempotency_key, requested_at,
                 expires_at, body)
            SELECT $7::text, $8::bigint, $9::text, $10::text, $11::text, $12::bigint,
                   $13::bigint, $14::text::jsonb
            WHERE NOT EXISTS (SELECT 1 FROM existing)
            ON CONFLICT DO NOTHING
            RETURNING id
        ),
        {}
        SELECT (SELECT seq FROM event), (SELECT body FROM existing)",
        append_ctes("inserted")
    )
}

pub(crate) fn decode_insert(row_id: &str, row: &Row) -> Decoded {
    let result = (|| {
        let seq = written_seq(row)?;
        let existing: Option<String> = row.try_get(1).map_err(column_err("an existing request"))?;
        Ok((seq, existing))
    })();
    match result {
        Err(err) => Decoded::failed(err),
        Ok((Some(seq), _)) => Decoded::wrote(seq, Outcome::Created(Inserted::New)),
        Ok((None, Some(body))) => Decoded::unwritten(
            decode_request(&body).map(|r| Outcome::Created(Inserted::Existing(Box::new(r)))),
        ),
        Ok((None, None)) => {
            Decoded::unwritten(Err(StoreError::Duplicate(format!("request {row_id}"))))
        }
    }
}

/// Stores the transition if the stored version is exactly one less, with its event.
/// Columns: the event's number, the request as stored before the statement (the
/// winner, when this one lost).
pub(crate) fn apply_sql() -> String {
    format!(
        "WITH updated AS (
            UPDATE requests
            SET version = $8::bigint, status = $9::text, requested_by = $10::text,
                idempotency_key = $11::text, requested_at = $12::bigint,
                expires_at = $13::bigint, body = $14::text::jsonb
            WHERE id = $7::text AND version = $8::bigint - 1
            RETURNING id
        ),
        {}
        SELECT (SELECT seq FROM event),
               (SELECT body::text FROM requests WHERE id = $7::text)",
        append_ctes("updated")
    )
}

pub(crate) fn decode_apply(row_id: &str, row: &Row) -> Decoded {
    let result = (|| {
        let seq = written_seq(row)?;
        let current: Option<String> = row.try_get(1).map_err(column_err("the current request"))?;
        Ok((seq, current))
    })();
    match result {
        Err(err) => Decoded::failed(err),
        Ok((Some(seq), _)) => Decoded::wrote(seq, Outcome::Applied),
        Ok((None, Some(body))) => Decoded::unwritten(decode_request(&body).and_then(|current| {
            Err(StoreError::VersionConflict {
                current: Box::new(current),
            })
        })),
        Ok((None, None)) => Decoded::unwritten(Err(StoreError::NotFound {
            what: "request",
            id: row_id.to_string(),
        })),
    }
}

pub(crate) const GET: &str = "SELECT body::text FROM requests WHERE id = $1";

/// Copies a request as it is, with no event, unless its id (or its requester's
/// idempotency key) is taken: then it changes nothing.
pub(crate) const IMPORT: &str = "INSERT INTO requests
         (id, version, status, requested_by, idempotency_key, requested_at, expires_at, body)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb)
     ON CONFLICT DO NOTHING";

/// The listing's SQL with only the filters asked for, so each shape can use its index,
/// and its parameters.
pub(crate) fn list_query(query: &RequestQuery) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
    let (filter, values) = request_filter(query, |n| format!("${n}"));
    let sql = format!(
        "SELECT body::text FROM requests {filter}
         ORDER BY requested_at DESC, id DESC LIMIT ${}",
        values.len() + 1
    );
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::with_capacity(values.len() + 1);
    for value in values {
        params.push(Box::new(value));
    }
    params.push(Box::new(to_sql_int(query.limit)));
    (sql, params)
}

pub(crate) const DUE_FOR_EXPIRY: &str = "SELECT body::text FROM requests
     WHERE status = 'pending' AND expires_at <= $1
     ORDER BY expires_at, id LIMIT $2";

pub(crate) fn due_params(now: Timestamp, limit: usize) -> (i64, i64) {
    (now.millis(), to_sql_int(limit))
}

/// The status is a literal, not a parameter, so that the planner can match the
/// partial index on pending requests.
pub(crate) const COUNT: &str = "SELECT count(*) FROM requests WHERE status = $1";

pub(crate) const NEXT_EXPIRY: &str =
    "SELECT min(expires_at) FROM requests WHERE status = 'pending'";

pub(crate) fn decode_next_expiry(row: &Row) -> Result<Option<Timestamp>, StoreError> {
    let millis: Option<i64> = row.try_get(0).map_err(column_err("the next expiry"))?;
    millis
        .map(|ms| timestamp("a request's expiry", ms))
        .transpose()
}

pub(crate) fn decode_bodies(rows: &[Row]) -> Result<Vec<ApprovalRequest>, StoreError> {
    rows.iter()
        .map(|row| {
            let body: String = row.try_get(0).map_err(column_err("a stored request"))?;
            decode_request(&body)
        })
        .collect()
}

/// Request rows after `$1` by id, as stored (for the audit).
pub(crate) const AFTER: &str = "SELECT id, version, status, requested_by, idempotency_key,
        requested_at, expires_at, body::text FROM requests
     WHERE id > $1::text ORDER BY id LIMIT $2::bigint";

pub(crate) fn decode_raw(rows: &[Row]) -> Result<Vec<countersign_store::RawRequest>, StoreError> {
    rows.iter()
        .map(|row| {
            let what = column_err("a stored request");
            Ok(countersign_store::RawRequest {
                id: row.try_get(0).map_err(&what)?,
                version: row.try_get(1).map_err(&what)?,
                status: row.try_get(2).map_err(&what)?,
                requested_by: row.try_get(3).map_err(&what)?,
                idempotency_key: row.try_get(4).map_err(&what)?,
                requested_at: row.try_get(5).map_err(&what)?,
                expires_at: row.try_get(6).map_err(&what)?,
                body: row.try_get(7).map_err(&what)?,
            })
        })
        .collect()
}
