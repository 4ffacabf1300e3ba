//! The event log: every state change, gap-free and in commit order, with the openings of
//! the entries' payload commitments beside it.

use std::collections::BTreeMap;

use countersign_core::PayloadOpening;
use countersign_store::rows::{EventRow, decode_event, decode_payload, to_sql_int, to_u64};
use countersign_store::{StoreError, StoredEvent};
use rusqlite::{Connection, params, params_from_iter};

use crate::error::db_err;

/// Appends `event` inside the writer's transaction and returns its sequence number.
///
/// The number is max + 1, read under the write lock, not AUTOINCREMENT: a job that
/// rolls back to its savepoint then leaves no hole, and commit order is sequence order
/// because only one transaction writes at a time, across all processes.
pub(crate) fn append(conn: &Connection, event: &EventRow) -> Result<u64, StoreError> {
    let seq: i64 = conn
        .prepare_cached(
            "INSERT INTO events (seq, at, kind, subject, bytes)
             SELECT coalesce(max(seq), 0) + 1, ?1, ?2, ?3, ?4 FROM events
             RETURNING seq",
        )
        .and_then(|mut stmt| {
            stmt.query_row(
                params![event.at, event.kind, event.subject, event.bytes],
                |row| row.get(0),
            )
        })
        .map_err(db_err("append an event"))?;
    if let Some((salt, payload)) = event.opening() {
        conn.prepare_cached("INSERT INTO payloads (seq, salt, payload) VALUES (?1, ?2, ?3)")
            .and_then(|mut stmt| stmt.execute(params![seq, salt, payload]))
            .map_err(db_err("store an event's payload"))?;
    }
    let seq = to_u64("an appended event's number", seq)?;
    crate::recent::appended(StoredEvent {
        seq,
        entry: event.entry.clone(),
        bytes: event.bytes.clone(),
    });
    Ok(seq)
}

fn decode_rows(
    stmt: &mut rusqlite::CachedStatement<'_>,
    params: impl rusqlite::Params,
) -> Result<Vec<StoredEvent>, StoreError> {
    let rows = stmt
        .query_map(params, |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, Vec<u8>>(1)?))
        })
        .map_err(db_err("read events"))?;
    let mut events = Vec::new();
    for row in rows {
        let (seq, bytes) = row.map_err(db_err("read events"))?;
        events.push(decode_event(seq, bytes)?);
    }
    Ok(events)
}

pub(crate) fn after(
    conn: &Connection,
    after: u64,
    limit: usize,
) -> Result<Vec<StoredEvent>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT seq, bytes FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2")
        .map_err(db_err("read events"))?;
    decode_rows(&mut stmt, params![to_sql_int(after), to_sql_int(limit)])
}

pub(crate) fn of_subject(conn: &Connection, subject: &str) -> Result<Vec<StoredEvent>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT seq, bytes FROM events WHERE subject = ?1 ORDER BY seq")
        .map_err(db_err("read a subject's events"))?;
    decode_rows(&mut stmt, params![subject])
}

pub(crate) fn of_subject_after(
    conn: &Connection,
    subject: &str,
    after: u64,
    limit: usize,
) -> Result<Vec<StoredEvent>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, bytes FROM events WHERE subject = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .map_err(db_err("read a subject's events"))?;
    decode_rows(
        &mut stmt,
        params![subject, to_sql_int(after), to_sql_int(limit)],
    )
}

pub(crate) fn of_subject_before(
    conn: &Connection,
    subject: &str,
    before: u64,
    limit: usize,
) -> Result<Vec<StoredEvent>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, bytes FROM events WHERE subject = ?1 AND seq < ?2 ORDER BY seq DESC LIMIT ?3",
        )
        .map_err(db_err("read a subject's events"))?;
    let mut events = decode_rows(
        &mut stmt,
        params![subject, to_sql_int(before), to_sql_int(limit)],
    )?;
    events.reverse();
    Ok(events)
}

pub(crate) fn payloads(
    conn: &Connection,
    seqs: &[u64],
) -> Result<BTreeMap<u64, PayloadOpening>, StoreError> {
    let mut out = BTreeMap::new();
    for chunk in seqs.chunks(500) {
        let marks = vec!["?"; chunk.len()].join(",");
        let sql = format!("SELECT seq, salt, payload FROM payloads WHERE seq IN ({marks})");
        let mut stmt = conn.prepare(&sql).map_err(db_err("read payloads"))?;
        let rows = stmt
            .query_map(
                params_from_iter(chunk.iter().map(|s| to_sql_int(*s))),
                |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                    ))
                },
            )
            .map_err(db_err("read payloads"))?;
        for row in rows {
            let (seq, salt, payload) = row.map_err(db_err("read payloads"))?;
            let (seq, opening) = decode_payload(seq, salt, &payload)?;
            out.insert(seq, opening);
        }
    }
    Ok(out)
}

pub(crate) fn erase_payloads(conn: &Connection, seqs: &[u64]) -> Result<u64, StoreError> {
    let mut stmt = conn
        .prepare_cached("DELETE FROM payloads WHERE seq = ?1")
        .map_err(db_err("erase payloads"))?;
    let mut erased = 0;
    for seq in seqs {
        erased += stmt
            .execute(params![to_sql_int(*seq)])
            .map_err(db_err("erase payloads"))? as u64;
    }
    Ok(erased)
}

pub(crate) fn last_seq(conn: &Connection) -> Result<u64, StoreError> {
    let seq: Option<i64> = conn
        .prepare_cached("SELECT max(seq) FROM events")
        .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
        .map_err(db_err("read the last event number"))?;
    to_u64("the number of the newest event", seq.unwrap_or(0))
}

/// The openings of events `from..=to`, as stored (for the audit).
pub(crate) fn payloads_between(
    conn: &Connection,
    from: u64,
    to: u64,
) -> Result<Vec<countersign_store::RawPayload>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, salt, payload FROM payloads WHERE seq >= ?1 AND seq <= ?2 ORDER BY seq",
        )
        .map_err(db_err("read payloads"))?;
    let rows = stmt
        .query_map(params![to_sql_int(from), to_sql_int(to)], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
            ))
        })
        .map_err(db_err("read payloads"))?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, salt, payload) = row.map_err(db_err("read payloads"))?;
        out.push(countersign_store::RawPayload {
            seq: to_u64("a payload's number", seq)?,
            salt,
            payload,
        });
    }
    Ok(out)
}
