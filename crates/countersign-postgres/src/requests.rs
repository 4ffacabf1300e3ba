//! Approval requests: insert with idempotency, compare-and-swap transitions, and the
//! queries the server and the expiry sweeper need.

use countersign_core::{ApprovalRequest, SealedTransition, Timestamp};
use countersign_store::{RequestQuery, StoreError};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::error::{column_err, corrupt, encode_err, timestamp, to_sql_int};
use crate::events::{EventRow, append_ctes, written_seq};
use crate::writer::{Decoded, Outcome};

/// A request's columns, encoded on the caller's task rather than the writer's.
pub(crate) struct RequestRow {
    id: String,
    version: i64,
    status: &'static str,
    requested_by: String,
    idempotency_key: Option<String>,
    requested_at: i64,
    expires_at: i64,
    body: String,
}

impl RequestRow {
    pub(crate) fn of(request: &ApprovalRequest) -> Result<Self, StoreError> {
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
        })
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The columns in the order of [`IMPORT`] (and of a transition's `$7`..`$14`).
    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 8] {
        [
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

/// A transition ready to write: its event is `$1`..`$6`, the request `$7`..`$14`.
pub(crate) struct TransitionRow {
    request: RequestRow,
    event: EventRow,
}

impl TransitionRow {
    pub(crate) fn of(transition: &SealedTransition) -> Result<Self, StoreError> {
        Ok(Self {
            request: RequestRow::of(&transition.request)?,
            event: EventRow::of(&transition.event)?,
        })
    }

    pub(crate) fn id(&self) -> &str {
        self.request.id()
    }

    pub(crate) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        let mut params: Vec<&(dyn ToSql + Sync)> = self.event.params().to_vec();
        params.extend_from_slice(&self.request.params());
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
            decode(&body).map(|r| Outcome::Created(Inserted::Existing(Box::new(r)))),
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
        Ok((None, Some(body))) => Decoded::unwritten(decode(&body).and_then(|current| {
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
    let mut filters = Vec::new();
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
    if let Some(status) = query.status {
        params.push(Box::new(status.as_str()));
        filters.push(format!("status = ${}", params.len()));
    }
    if let Some(requested_by) = &query.requested_by {
        params.push(Box::new(requested_by.clone()));
        filters.push(format!("requested_by = ${}", params.len()));
    }
    params.push(Box::new(to_sql_int(query.limit)));
    let filter = if filters.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", filters.join(" AND "))
    };
    let sql = format!(
        "SELECT body::text FROM requests {filter}
         ORDER BY requested_at DESC, id DESC LIMIT ${}",
        params.len()
    );
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
            decode(&body)
        })
        .collect()
}

fn decode(body: &str) -> Result<ApprovalRequest, StoreError> {
    serde_json::from_str(body).map_err(|e| corrupt("a stored request", e))
}
