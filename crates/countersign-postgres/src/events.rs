//! The event log: every state change, gap-free and in commit order, with the openings of
//! the entries' payload commitments beside it.
//!
//! Every write that appends an event is one SQL statement (see `writer.rs` for why):
//! its own change in data-modifying CTEs, then [`append_ctes`], which inserts the event
//! only if the change happened. The statement runs under the log head lock, so
//! `max(seq) + 1` is the next number across all instances, and a statement that does
//! not insert burns none.

use std::collections::BTreeMap;

use countersign_core::PayloadOpening;
use countersign_store::rows::{EventRow, decode_event, decode_payload, to_sql_int, to_u64};
use countersign_store::{StoreError, StoredEvent};
use tokio_postgres::Row;

use crate::error::column_err;
use crate::params::{Param, Params};

/// An event's values are parameters `$1` to `$6` of every appending statement.
impl Params for EventRow {
    fn params(&self) -> Vec<Param<'_>> {
        vec![
            &self.at,
            &self.kind,
            &self.subject,
            &self.bytes,
            &self.salt,
            &self.payload,
        ]
    }
}

/// The CTEs `event` (returning the new `seq`) and `opening` that append the event in
/// `$1`..`$6` if the CTE named `gate` returned a row. The statement's last column
/// should be `(SELECT seq FROM event)`: the number, or NULL when nothing was written.
pub(crate) fn append_ctes(gate: &str) -> String {
    format!(
        "event AS (
            INSERT INTO events (seq, at, kind, subject, bytes)
            SELECT coalesce((SELECT max(seq) FROM events), 0) + 1,
                   $1::bigint, $2::text, $3::text, $4::bytea
            WHERE EXISTS (SELECT 1 FROM {gate})
            RETURNING seq
        ),
        opening AS (
            INSERT INTO payloads (seq, salt, payload)
            SELECT seq, $5::text, $6::text FROM event WHERE $5::text IS NOT NULL
        )"
    )
}

/// Appends an event that changes nothing else.
pub(crate) fn append_sql() -> String {
    format!(
        "WITH always AS (SELECT 1), {}
         SELECT (SELECT seq FROM event)",
        append_ctes("always")
    )
}

/// The sequence number an appending statement wrote, from its first column.
pub(crate) fn written_seq(row: &Row) -> Result<Option<u64>, StoreError> {
    let seq: Option<i64> = row
        .try_get(0)
        .map_err(column_err("the number of an appended event"))?;
    seq.map(|s| to_u64("an appended event's number", s))
        .transpose()
}

pub(crate) const AFTER: &str = "SELECT seq, bytes FROM events WHERE seq > $1 ORDER BY seq LIMIT $2";
pub(crate) const OF_SUBJECT: &str = "SELECT seq, bytes FROM events WHERE subject = $1 ORDER BY seq";
pub(crate) const OF_SUBJECT_AFTER: &str =
    "SELECT seq, bytes FROM events WHERE subject = $1 AND seq > $2 ORDER BY seq LIMIT $3";
pub(crate) const OF_SUBJECT_BEFORE: &str =
    "SELECT seq, bytes FROM events WHERE subject = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3";
pub(crate) const PAYLOADS: &str =
    "SELECT seq, salt, payload FROM payloads WHERE seq = ANY($1::bigint[])";
pub(crate) const LAST_SEQ: &str = "SELECT last_seq FROM log_head";

pub(crate) fn after_params(after: u64, limit: usize) -> (i64, i64) {
    (to_sql_int(after), to_sql_int(limit))
}

pub(crate) fn decode_events(rows: &[Row]) -> Result<Vec<StoredEvent>, StoreError> {
    rows.iter()
        .map(|row| {
            let seq: i64 = row.try_get(0).map_err(column_err("an event's number"))?;
            let bytes: Vec<u8> = row.try_get(1).map_err(column_err("an event's bytes"))?;
            decode_event(seq, bytes)
        })
        .collect()
}

/// The numbers to ask for: without repeats, and none that cannot be stored.
pub(crate) fn payload_seqs(seqs: &[u64]) -> Vec<i64> {
    let mut wanted: Vec<i64> = seqs.iter().filter_map(|s| i64::try_from(*s).ok()).collect();
    wanted.sort_unstable();
    wanted.dedup();
    wanted
}

pub(crate) fn decode_payloads(rows: &[Row]) -> Result<BTreeMap<u64, PayloadOpening>, StoreError> {
    let mut out = BTreeMap::new();
    for row in rows {
        let seq: i64 = row.try_get(0).map_err(column_err("a payload's number"))?;
        let salt: String = row.try_get(1).map_err(column_err("a payload's salt"))?;
        let payload: String = row.try_get(2).map_err(column_err("a payload"))?;
        let (seq, opening) = decode_payload(seq, salt, &payload)?;
        out.insert(seq, opening);
    }
    Ok(out)
}

pub(crate) fn decode_last_seq(row: &Row) -> Result<u64, StoreError> {
    let seq: i64 = row
        .try_get(0)
        .map_err(column_err("the number of the newest event"))?;
    to_u64("the number of the newest event", seq)
}

/// The openings of events `$1..=$2`, as stored (for the audit).
pub(crate) const PAYLOADS_BETWEEN: &str = "SELECT seq, salt, payload FROM payloads
     WHERE seq >= $1::bigint AND seq <= $2::bigint ORDER BY seq";

pub(crate) fn decode_raw_payloads(
    rows: &[Row],
) -> Result<Vec<countersign_store::RawPayload>, StoreError> {
    rows.iter()
        .map(|row| {
            let seq: i64 = row.try_get(0).map_err(column_err("a payload's number"))?;
            Ok(countersign_store::RawPayload {
                seq: countersign_store::rows::to_u64("a payload's number", seq)?,
                salt: row.try_get(1).map_err(column_err("a payload's salt"))?,
                payload: row.try_get(2).map_err(column_err("a payload"))?,
            })
        })
        .collect()
}
