//! The Merkle tree over the events, and the signed checkpoints.
//!
//! Integration is idempotent and may run in several processes: each stores the nodes of
//! entries `[from, to)` and moves `integrated_size` from `from` to `to` only if it is
//! still `from`, inside one write transaction.

use std::collections::BTreeMap;

use countersign_core::merkle::{Hash, NodeId};
use countersign_store::rows::{decode_checkpoint, decode_integrated_size, node_hash, to_sql_int};
use countersign_store::{StoreError, StoredCheckpoint};
use rusqlite::{Connection, OptionalExtension, params};

use crate::error::db_err;

pub(crate) fn meta(conn: &Connection, key: &str) -> Result<Option<String>, StoreError> {
    conn.prepare_cached("SELECT value FROM log_meta WHERE key = ?1")
        .and_then(|mut stmt| stmt.query_row([key], |r| r.get(0)).optional())
        .map_err(db_err("read the log settings"))
}

fn set_meta(conn: &Connection, key: &str, value: &str) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO log_meta (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )
    .and_then(|mut stmt| stmt.execute(params![key, value]))
    .map_err(db_err("write the log settings"))?;
    Ok(())
}

pub(crate) fn origin(conn: &Connection, proposed: &str) -> Result<String, StoreError> {
    match meta(conn, "origin")? {
        Some(existing) => Ok(existing),
        None => {
            set_meta(conn, "origin", proposed)?;
            Ok(proposed.to_string())
        }
    }
}

pub(crate) fn integrated_size(conn: &Connection) -> Result<u64, StoreError> {
    decode_integrated_size(meta(conn, "integrated_size")?)
}

pub(crate) fn integrate(
    conn: &Connection,
    from: u64,
    to: u64,
    nodes: &[(NodeId, Hash)],
) -> Result<bool, StoreError> {
    if integrated_size(conn)? != from {
        return Ok(false);
    }
    let last = crate::events::last_seq(conn)?;
    if to < from || to > last {
        return Err(StoreError::Backend(format!(
            "integrate: cannot move the tree from {from} to {to} entries with {last} stored"
        )));
    }
    let mut stmt = conn
        .prepare_cached("INSERT INTO log_nodes (level, idx, hash) VALUES (?1, ?2, ?3)")
        .map_err(db_err("store Merkle nodes"))?;
    for (id, hash) in nodes {
        // Nodes are written once: a clash means the tree would be rewritten.
        stmt.execute(params![
            i64::from(id.level),
            to_sql_int(id.index),
            hash.as_slice()
        ])
        .map_err(|e| {
            if crate::error::is_unique_violation(&e) {
                StoreError::Corrupt(format!(
                    "Merkle node {}/{} already exists: refusing to rewrite the tree",
                    id.level, id.index
                ))
            } else {
                db_err("store Merkle nodes")(e)
            }
        })?;
    }
    set_meta(conn, "integrated_size", &to.to_string())?;
    Ok(true)
}

pub(crate) fn nodes(
    conn: &Connection,
    ids: &[NodeId],
) -> Result<BTreeMap<NodeId, Hash>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT hash FROM log_nodes WHERE level = ?1 AND idx = ?2")
        .map_err(db_err("read Merkle nodes"))?;
    let mut out = BTreeMap::new();
    for id in ids {
        if out.contains_key(id) {
            continue;
        }
        let hash: Option<Vec<u8>> = stmt
            .query_row(params![i64::from(id.level), to_sql_int(id.index)], |r| {
                r.get(0)
            })
            .optional()
            .map_err(db_err("read Merkle nodes"))?;
        let hash = hash.ok_or_else(|| StoreError::NotFound {
            what: "Merkle node",
            id: format!("{}/{}", id.level, id.index),
        })?;
        out.insert(*id, node_hash(*id, hash)?);
    }
    Ok(out)
}

pub(crate) fn add_checkpoint(
    conn: &Connection,
    checkpoint: &StoredCheckpoint,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO checkpoints (size, note, created_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (size) DO NOTHING",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            to_sql_int(checkpoint.size),
            checkpoint.note,
            checkpoint.created_at.millis()
        ])
    })
    .map_err(db_err("store a checkpoint"))?;
    Ok(())
}

pub(crate) fn checkpoint(
    conn: &Connection,
    size: Option<u64>,
) -> Result<Option<StoredCheckpoint>, StoreError> {
    let row: Option<(i64, String, i64)> = match size {
        Some(size) => conn
            .prepare_cached("SELECT size, note, created_at FROM checkpoints WHERE size = ?1")
            .and_then(|mut stmt| {
                stmt.query_row([to_sql_int(size)], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .optional()
            }),
        None => conn
            .prepare_cached(
                "SELECT size, note, created_at FROM checkpoints ORDER BY size DESC LIMIT 1",
            )
            .and_then(|mut stmt| {
                stmt.query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()
            }),
    }
    .map_err(db_err("read a checkpoint"))?;
    row.map(|(s, n, a)| decode_checkpoint(s, n, a)).transpose()
}

pub(crate) fn checkpoints(conn: &Connection) -> Result<Vec<StoredCheckpoint>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT size, note, created_at FROM checkpoints ORDER BY size")
        .map_err(db_err("read checkpoints"))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .and_then(|rows| rows.collect::<Result<Vec<(i64, String, i64)>, _>>())
        .map_err(db_err("read checkpoints"))?;
    rows.into_iter()
        .map(|(s, n, a)| decode_checkpoint(s, n, a))
        .collect()
}
