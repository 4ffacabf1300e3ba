//! The Merkle tree over the events, and the signed checkpoints.
//!
//! Integration may run in several instances at once. Each moves `integrated_size` from
//! `from` to `to` with a conditional UPDATE of its row before storing any node: the
//! row lock makes a concurrent integrator wait, and once the winner commits, the
//! waiter's UPDATE re-reads the row, no longer matches and changes nothing, so the
//! loser stores nothing. None of this touches the log head, so integration never
//! delays appends.

use std::collections::{BTreeMap, BTreeSet};

use countersign_core::merkle::{Hash, NodeId};
use countersign_store::{StoreError, StoredCheckpoint};
use deadpool_postgres::Object;
use tokio_postgres::Row;

use countersign_store::rows::{corrupt, decode_checkpoint, decode_node, to_sql_int, to_u64};

use crate::error::{Failure, classify, column_err, db_err, describe};

pub(crate) const META: &str = "SELECT value FROM log_meta WHERE key = $1";
/// Sets a setting unless it has a value already.
pub(crate) const PROPOSE_META: &str =
    "INSERT INTO log_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING";

pub(crate) fn decode_meta(rows: &[Row]) -> Result<Option<String>, StoreError> {
    rows.first()
        .map(|row| row.try_get(0).map_err(column_err("a log setting")))
        .transpose()
}

pub(crate) async fn integrate(
    client: &mut Object,
    from: u64,
    to: u64,
    nodes: &[(NodeId, Hash)],
    checkpoint: Option<&StoredCheckpoint>,
) -> Result<bool, StoreError> {
    let op = "integrate log entries";
    if to < from {
        return Err(StoreError::Backend(format!(
            "{op}: cannot integrate from {from} back to {to}"
        )));
    }
    let tx = client.transaction().await.map_err(db_err(op))?;
    let moved = tx
        .execute(
            "UPDATE log_meta SET value = $2 WHERE key = 'integrated_size' AND value = $1",
            &[&from.to_string(), &to.to_string()],
        )
        .await
        .map_err(db_err(op))?;
    if moved == 0 {
        // Another integrator got there first (or `from` is stale): write nothing.
        return Ok(false);
    }
    let last: i64 = tx
        .query_one(crate::events::LAST_SEQ, &[])
        .await
        .map_err(db_err(op))?
        .try_get(0)
        .map_err(column_err("the number of the newest event"))?;
    let last = to_u64("the number of the newest event", last)?;
    // Checked after the size, so that a stale integrator just loses; the transaction
    // rolls back when dropped.
    if to > last {
        return Err(StoreError::Backend(format!(
            "{op}: asked to integrate up to {to} entries, but only {last} are stored"
        )));
    }
    let mut levels = Vec::with_capacity(nodes.len());
    let mut indexes = Vec::with_capacity(nodes.len());
    let mut hashes = Vec::with_capacity(nodes.len());
    for (id, hash) in nodes {
        levels.push(i16::from(id.level));
        indexes.push(to_sql_int(id.index));
        hashes.push(hash.to_vec());
    }
    tx.execute(
        "INSERT INTO log_nodes (level, idx, hash)
         SELECT * FROM unnest($1::smallint[], $2::bigint[], $3::bytea[])",
        &[&levels, &indexes, &hashes],
    )
    .await
    .map_err(|e| {
        if classify(&e) == Failure::Unique {
            // Nodes are written once, by the integrator that moved the size past them.
            corrupt(
                format!("{op}: a Merkle node of entries {from}..{to} is already stored"),
                describe(&e),
            )
        } else {
            db_err(op)(e)
        }
    })?;
    // Signed over the new tree, in the same transaction: both or neither.
    if let Some(checkpoint) = checkpoint {
        let size = to_sql_int(checkpoint.size);
        let at = checkpoint.created_at.millis();
        tx.execute(ADD_CHECKPOINT, &[&size, &checkpoint.note, &at])
            .await
            .map_err(db_err("store a checkpoint"))?;
    }
    tx.commit().await.map_err(db_err("commit an integration"))?;
    Ok(true)
}

pub(crate) const NODES: &str = "SELECT n.level, n.idx, n.hash
     FROM unnest($1::smallint[], $2::bigint[]) AS wanted (level, idx)
     JOIN log_nodes AS n USING (level, idx)";

/// The distinct ids asked for, as the two arrays [`NODES`] takes.
pub(crate) fn node_params(ids: &[NodeId]) -> (BTreeSet<NodeId>, Vec<i16>, Vec<i64>) {
    let wanted: BTreeSet<NodeId> = ids.iter().copied().collect();
    let levels = wanted.iter().map(|id| i16::from(id.level)).collect();
    let indexes = wanted.iter().map(|id| to_sql_int(id.index)).collect();
    (wanted, levels, indexes)
}

pub(crate) fn decode_nodes(
    wanted: &BTreeSet<NodeId>,
    rows: &[Row],
) -> Result<BTreeMap<NodeId, Hash>, StoreError> {
    let mut out = BTreeMap::new();
    for row in rows {
        let level: i16 = row
            .try_get(0)
            .map_err(column_err("a Merkle node's level"))?;
        let index: i64 = row
            .try_get(1)
            .map_err(column_err("a Merkle node's index"))?;
        let hash: Vec<u8> = row.try_get(2).map_err(column_err("a Merkle node"))?;
        let (id, hash) = decode_node(level.into(), index, hash)?;
        out.insert(id, hash);
    }
    if let Some(missing) = wanted.iter().find(|id| !out.contains_key(id)) {
        return Err(StoreError::NotFound {
            what: "Merkle node",
            id: format!("{}/{}", missing.level, missing.index),
        });
    }
    Ok(out)
}

pub(crate) const ADD_CHECKPOINT: &str = "INSERT INTO checkpoints (size, note, created_at)
     VALUES ($1, $2, $3) ON CONFLICT (size) DO NOTHING";
pub(crate) const CHECKPOINT_OF_SIZE: &str =
    "SELECT size, note, created_at FROM checkpoints WHERE size = $1";
pub(crate) const LATEST_CHECKPOINT: &str =
    "SELECT size, note, created_at FROM checkpoints ORDER BY size DESC LIMIT 1";
pub(crate) const CHECKPOINTS: &str = "SELECT size, note, created_at FROM checkpoints ORDER BY size";

pub(crate) fn decode_checkpoints(rows: &[Row]) -> Result<Vec<StoredCheckpoint>, StoreError> {
    rows.iter()
        .map(|row| {
            let column = column_err("a checkpoint");
            let size: i64 = row.try_get(0).map_err(&column)?;
            let note: String = row.try_get(1).map_err(&column)?;
            let at: i64 = row.try_get(2).map_err(&column)?;
            decode_checkpoint(size, note, at)
        })
        .collect()
}
