//! Small documents (accounts, sessions, invitations, settings, rooms), one-time
//! settings, and the raw copies `migrate-data` needs.
//!
//! A document write that appends an event goes through the writer like every other
//! appending write (see `writer.rs`): one statement, the document change in
//! data-modifying CTEs, then [`append_ctes`] gated on the change, which reports rather
//! than raises the expected refusals (a taken id or key, a stale version). A write
//! without an event is the same statement without the event, on a pooled connection:
//! it needs no log head lock, and the row lock and the unique indexes make its
//! compare-and-swap and its uniqueness hold against every other instance all the same.

use countersign_core::SealedEvent;
use countersign_store::rows::{DocRow, EventRow};
use countersign_store::{Doc, StoreError};
use tokio_postgres::Row;

use crate::error::{Failure, classify, column_err, map};
use crate::events::{append_ctes, written_seq};
use crate::params::{Param, Params};
use crate::writer::{Decoded, Outcome};

/// Which write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DocOp {
    Insert,
    Update,
}

/// A document's columns in the order of [`write_sql`]'s.
impl Params for DocRow {
    fn params(&self) -> Vec<Param<'_>> {
        vec![
            &self.kind,
            &self.id,
            &self.version,
            &self.key,
            &self.body,
            &self.updated_at,
        ]
    }
}

/// An insert or a compare-and-swap update of a document, with or without its event.
/// With an event, the event is `$1`..`$6` and the document `$7`..`$12`; without, the
/// document is `$1`..`$6`.
pub(crate) struct DocWrite {
    op: DocOp,
    row: DocRow,
    event: Option<EventRow>,
}

impl DocWrite {
    pub(crate) fn new(
        op: DocOp,
        doc: &Doc,
        event: Option<&SealedEvent>,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            op,
            row: DocRow::of(doc)?,
            event: event.map(EventRow::of).transpose()?,
        })
    }

    pub(crate) fn op(&self) -> DocOp {
        self.op
    }

    pub(crate) fn has_event(&self) -> bool {
        self.event.is_some()
    }

    pub(crate) fn what(&self) -> &'static str {
        match self.op {
            DocOp::Insert => "insert a document",
            DocOp::Update => "update a document",
        }
    }

    /// Its statement: [`write_sql`] for its operation, with an event if it has one.
    pub(crate) fn sql(&self) -> String {
        write_sql(self.op, self.has_event())
    }

    pub(crate) fn params(&self) -> Vec<Param<'_>> {
        let mut params = self.event.as_ref().map(Params::params).unwrap_or_default();
        params.extend(self.row.params());
        params
    }

    /// Maps an error the statement raised. The statement looks for a clashing id or
    /// key first, so a unique violation of the documents' indexes means that another
    /// connection took the key meanwhile: the same refusal, reported late.
    pub(crate) fn error(&self, err: &tokio_postgres::Error) -> StoreError {
        let index = err.as_db_error().and_then(|db| db.constraint());
        if classify(err) == Failure::Unique && index.is_some_and(|i| i.starts_with("documents_")) {
            self.row.duplicate(None)
        } else {
            map(self.what(), err)
        }
    }

    fn name(&self) -> String {
        format!("{}/{}", self.row.kind, self.row.id)
    }

    /// Reads the statement's result: the event it wrote, and the write's own result.
    /// An error means the result does not add up, so what was written is unknown.
    fn read(&self, row: &Row) -> Result<(Option<u64>, Result<(), StoreError>), StoreError> {
        let column = column_err("the result of a document write");
        let seq = written_seq(row)?;
        let written: bool = row.try_get(1).map_err(&column)?;
        let current: Option<i64> = row.try_get(2).map_err(&column)?;
        let clash: Option<String> = row.try_get(3).map_err(&column)?;
        // With an event, the event is written exactly when the document is; without,
        // never.
        let expected_seq = written && self.has_event();
        if seq.is_some() != expected_seq {
            return Err(StoreError::Backend(format!(
                "{} {}: the document {} written but its event {}",
                self.what(),
                self.name(),
                if written { "was" } else { "was not" },
                if seq.is_some() { "was" } else { "was not" },
            )));
        }
        if written {
            return Ok((seq, Ok(())));
        }
        let refusal = match (self.op, current) {
            (DocOp::Insert, _) => self.row.duplicate(clash.as_deref()),
            (DocOp::Update, None) => self.row.not_found(),
            (DocOp::Update, Some(current)) if current != self.row.version - 1 => {
                self.row.conflict(current)
            }
            (DocOp::Update, Some(_)) if clash.is_some() => self.row.duplicate(clash.as_deref()),
            // At the expected version when the statement began, yet not updated: a
            // concurrent write changed it first.
            (DocOp::Update, Some(_)) => StoreError::Conflict(format!(
                "{} {} (changed by a concurrent write)",
                self.row.kind, self.row.id
            )),
        };
        Ok((None, Err(refusal)))
    }

    /// The result for the writer.
    pub(crate) fn decode(&self, row: &Row) -> Decoded {
        match self.read(row) {
            Err(err) => Decoded::failed(err),
            Ok((Some(seq), Ok(()))) => Decoded::wrote(seq, Outcome::DocWritten),
            Ok((None, result)) => Decoded::unwritten(result.map(|()| Outcome::DocWritten)),
            Ok((Some(_), Err(err))) => Decoded::failed(err),
        }
    }

    /// The result of the statement run on its own (without an event).
    pub(crate) fn result(&self, rows: &[Row]) -> Result<(), StoreError> {
        let [row] = rows else {
            return Err(StoreError::Backend(format!(
                "{}: the statement returned {} rows instead of 1",
                self.what(),
                rows.len()
            )));
        };
        self.read(row)?.1
    }
}

/// The statement of a document write. Columns: the event's number (NULL without an
/// event), whether the document was written, its version before the statement (updates
/// only), and the id of a document of the kind that holds the id or key (this id first).
///
/// An insert writes only if neither its id nor its key is taken (`ON CONFLICT DO
/// NOTHING` is the backstop against a racing insert). An update writes only if the
/// stored version is one less and no other document of the kind holds the new key.
pub(crate) fn write_sql(op: DocOp, event: bool) -> String {
    let first = if event { 7 } else { 1 };
    let kind = format!("${}::text", first);
    let id = format!("${}::text", first + 1);
    let version = format!("${}::bigint", first + 2);
    let key = format!("${}::text", first + 3);
    let body = format!("${}::text::json", first + 4);
    let at = format!("${}::bigint", first + 5);
    let change = match op {
        DocOp::Insert => format!(
            "current AS (SELECT NULL::bigint AS version),
            clash AS (
                SELECT id FROM documents
                WHERE kind = {kind} AND (id = {id} OR key = {key})
                ORDER BY id = {id} DESC
                LIMIT 1
            ),
            written AS (
                INSERT INTO documents (kind, id, version, key, body, updated_at)
                SELECT {kind}, {id}, {version}, {key}, {body}, {at}
                WHERE NOT EXISTS (SELECT 1 FROM clash)
                ON CONFLICT DO NOTHING
                RETURNING id
            )"
        ),
        DocOp::Update => format!(
            "current AS (
                SELECT version FROM documents WHERE kind = {kind} AND id = {id}
            ),
            clash AS (
                SELECT id FROM documents
                WHERE kind = {kind} AND key = {key} AND id <> {id}
                LIMIT 1
            ),
            written AS (
                UPDATE documents
                SET version = {version}, key = {key}, body = {body}, updated_at = {at}
                WHERE kind = {kind} AND id = {id} AND version = {version} - 1
                  AND NOT EXISTS (SELECT 1 FROM clash)
                RETURNING id
            )"
        ),
    };
    let (event_ctes, seq) = if event {
        (
            format!(", {}", append_ctes("written")),
            "(SELECT seq FROM event)",
        )
    } else {
        (String::new(), "NULL::bigint")
    };
    format!(
        "WITH {change}{event_ctes}
        SELECT {seq}, EXISTS (SELECT 1 FROM written), (SELECT version FROM current),
               (SELECT id FROM clash)"
    )
}

const COLUMNS: &str = "kind, id, version, key, body::text, updated_at";

pub(crate) const COUNT: &str = "SELECT count(*) FROM documents WHERE kind = $1";

pub(crate) fn get_sql() -> String {
    format!("SELECT {COLUMNS} FROM documents WHERE kind = $1 AND id = $2")
}

pub(crate) fn by_key_sql() -> String {
    format!("SELECT {COLUMNS} FROM documents WHERE kind = $1 AND key = $2")
}

/// Documents of kind `$1` with ids in [`$2`, `$3`) (see [`prefix_end`]), by id, at most
/// `$4`.
pub(crate) fn list_range_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM documents
         WHERE kind = $1 AND id >= $2 AND id < $3
         ORDER BY id LIMIT $4"
    )
}

/// Documents of kind `$1` with ids starting with `$2`, for a prefix with no end (empty,
/// or only U+10FFFF), by id, at most `$3`.
pub(crate) fn list_open_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM documents
         WHERE kind = $1 AND id >= $2 AND starts_with(id, $2)
         ORDER BY id LIMIT $3"
    )
}

pub(crate) fn list_recent_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM documents
         WHERE kind = $1
         ORDER BY updated_at DESC, id DESC LIMIT $2"
    )
}

pub(crate) const DELETE: &str = "DELETE FROM documents WHERE kind = $1 AND id = $2";
pub(crate) const DELETE_RANGE: &str =
    "DELETE FROM documents WHERE kind = $1 AND id >= $2 AND id < $3";
pub(crate) const DELETE_OPEN: &str =
    "DELETE FROM documents WHERE kind = $1 AND id >= $2 AND starts_with(id, $2)";

/// The settings whose key starts with `$1`, in byte order as in SQLite.
pub(crate) const META_PREFIX: &str =
    "SELECT key, value FROM log_meta WHERE starts_with(key, $1) ORDER BY key COLLATE \"C\"";

/// The least string above every string that starts with `prefix`, in byte (= code
/// point) order, so that those strings are exactly [`prefix`, end): the prefix with its
/// last character replaced by the next one (dropping trailing U+10FFFF, which has
/// none). `None` when there is no such string: an empty prefix, or only U+10FFFF.
pub(crate) fn prefix_end(prefix: &str) -> Option<String> {
    let mut end = prefix.to_string();
    while let Some(last) = end.pop() {
        let next = match last {
            // The surrogates are not characters.
            '\u{d7ff}' => Some('\u{e000}'),
            c => char::from_u32(u32::from(c) + 1),
        };
        if let Some(next) = next {
            end.push(next);
            return Some(end);
        }
    }
    None
}

pub(crate) fn decode_docs(rows: &[Row]) -> Result<Vec<Doc>, StoreError> {
    rows.iter().map(decode_doc).collect()
}

fn decode_doc(row: &Row) -> Result<Doc, StoreError> {
    let column = column_err("a document");
    DocRow {
        kind: row.try_get(0).map_err(&column)?,
        id: row.try_get(1).map_err(&column)?,
        version: row.try_get(2).map_err(&column)?,
        key: row.try_get(3).map_err(&column)?,
        body: row.try_get(4).map_err(&column)?,
        updated_at: row.try_get(5).map_err(&column)?,
    }
    .decode()
}

pub(crate) fn decode_meta_list(rows: &[Row]) -> Result<Vec<(String, String)>, StoreError> {
    let column = column_err("a setting");
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get(0).map_err(&column)?,
                row.try_get(1).map_err(&column)?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_bounds_exactly_the_strings_with_the_prefix() {
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("u1/").as_deref(), Some("u10"));
        assert_eq!(prefix_end("a").as_deref(), Some("b"));
        assert_eq!(prefix_end("a\u{7f}").as_deref(), Some("a\u{80}"));
        assert_eq!(prefix_end("x\u{d7ff}").as_deref(), Some("x\u{e000}"));
        assert_eq!(prefix_end("ab\u{10ffff}").as_deref(), Some("ac"));
        assert_eq!(prefix_end("\u{10ffff}\u{10ffff}"), None);

        // Bytewise, as PostgreSQL compares under COLLATE "C".
        let prefix = "u1/é";
        let end = prefix_end(prefix).unwrap_or_default();
        for s in ["u1/é", "u1/éa", "u1/é\u{10ffff}", "u1/é/x"] {
            assert!(
                prefix.as_bytes() <= s.as_bytes() && s.as_bytes() < end.as_bytes(),
                "{s}"
            );
        }
        for s in ["u1/e", "u1/ê", "u1/f", "u1", "u1/", "u1/ë"] {
            let inside = prefix.as_bytes() <= s.as_bytes() && s.as_bytes() < end.as_bytes();
            assert!(!inside, "{s}");
        }
    }
}
