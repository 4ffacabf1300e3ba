//! The event log: every state change, gap-free and in commit order.

use countersign_core::Event;
use countersign_store::{StoreError, StoredEvent};
use rusqlite::{Connection, params};

use crate::error::{corrupt, db_err, to_sql_int};

/// An event ready to insert, encoded on the caller's thread rather than the writer's.
pub(crate) struct EventRow {
    at: i64,
    kind: &'static str,
    request_id: Option<String>,
    bytes: Vec<u8>,
}

impl EventRow {
    pub(crate) fn of(event: &Event) -> Self {
        Self {
            at: event.at.millis(),
            kind: event.kind(),
            request_id: event.request_id().map(str::to_string),
            bytes: event.to_bytes(),
        }
    }
}

/// Appends `event` inside the writer's transaction and returns its sequence number.
///
/// The number is max + 1, read under the write lock, not AUTOINCREMENT: a job that
/// rolls back to its savepoint then leaves no hole, and commit order is sequence order
/// because only one transaction writes at a time, across all processes.
pub(crate) fn append(conn: &Connection, event: &EventRow) -> Result<u64, StoreError> {
    let seq: i64 = conn
        .prepare_cached(
            "INSERT INTO events (seq, at, kind, request_id, bytes)
             SELECT coalesce(max(seq), 0) + 1, ?1, ?2, ?3, ?4 FROM events
             RETURNING seq",
        )
        .and_then(|mut stmt| {
            stmt.query_row(
                params![event.at, event.kind, event.request_id, event.bytes],
                |row| row.get(0),
            )
        })
        .map_err(db_err("append an event"))?;
    Ok(seq.max(0) as u64)
}

pub(crate) fn after(
    conn: &Connection,
    after: u64,
    limit: usize,
) -> Result<Vec<StoredEvent>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT seq, bytes FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2")
        .map_err(db_err("read events"))?;
    let rows = stmt
        .query_map(params![to_sql_int(after), to_sql_int(limit)], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, Vec<u8>>(1)?))
        })
        .map_err(db_err("read events"))?;
    let mut events = Vec::new();
    for row in rows {
        let (seq, bytes) = row.map_err(db_err("read events"))?;
        let event: Event =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("event {seq}"), e))?;
        events.push(StoredEvent {
            seq: seq.max(0) as u64,
            event,
            bytes,
        });
    }
    Ok(events)
}

pub(crate) fn last_seq(conn: &Connection) -> Result<u64, StoreError> {
    let seq: Option<i64> = conn
        .prepare_cached("SELECT max(seq) FROM events")
        .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
        .map_err(db_err("read the last event number"))?;
    Ok(seq.unwrap_or(0).max(0) as u64)
}
