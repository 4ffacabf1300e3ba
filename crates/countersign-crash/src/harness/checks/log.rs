//! After a restart: the log recomputes to every signed checkpoint, the stored Merkle
//! nodes match the entries, and no checkpoint seen before vanished or changed.
//!
//! Incremental: the leaf hashes of the entries checked so far are kept ([`Tracked`]), so
//! a restart hashes only the new entries and checks only the new checkpoints; those
//! seen before are compared as text. The last cycle recomputes the whole log from its
//! stored entries (`full`).

use std::collections::BTreeMap;
use std::path::Path;

use countersign_core::LogEntry;
use countersign_core::checkpoint::Checkpoint;
use countersign_core::logcheck::verify_log;
use countersign_core::merkle::{self, CompactRange, Hash};
use countersign_server::KeyRing;
use countersign_store::Store;

use super::Carry;
use super::state::events_after;
use crate::server;

/// The log as checked so far.
#[derive(Default)]
pub(crate) struct Tracked {
    leaves: Vec<Hash>,
    range: CompactRange,
}

impl Tracked {
    /// The root of the first `size` entries checked.
    fn root(&self, size: u64) -> Option<Hash> {
        if size == self.range.size() {
            return Some(self.range.root());
        }
        let mut range = CompactRange::empty();
        for leaf in self.leaves.get(..usize::try_from(size).ok()?)? {
            range.append(*leaf);
        }
        Some(range.root())
    }
}

/// Checks the log's new entries and checkpoints (all of them when `full`), the stored
/// tree, and that no checkpoint seen before vanished or changed.
pub(crate) async fn check_log(
    store: &dyn Store,
    data_dir: &Path,
    carry: &mut Carry,
    full: bool,
) -> anyhow::Result<Vec<String>> {
    let mut violations = Vec::new();
    let keys = KeyRing::open_existing(&server::keys_dir(data_dir))?;
    let jwks = countersign_server::keyring::published_jwks(store, &keys).await?;
    let origin = store.log_origin("").await?;
    let checkpoints = store.checkpoints().await?;
    let mut roots: BTreeMap<u64, Hash> = BTreeMap::new();
    let entries;
    if full {
        let events = events_after(store, 0).await?;
        let notes: Vec<String> = checkpoints.iter().map(|c| c.note.clone()).collect();
        let report = verify_log(
            events.iter().map(|e| e.bytes.as_slice()),
            &notes,
            &jwks,
            &origin,
        );
        violations.extend(report.problems.iter().map(|p| format!("log: {p}")));
        roots = report.roots;
        entries = report.entries;
    } else {
        let log = &mut carry.log;
        let new = events_after(store, log.range.size()).await?;
        for e in &new {
            let index = log.range.size();
            match serde_json::from_slice::<LogEntry>(&e.bytes) {
                Ok(entry) if entry.to_bytes() == e.bytes => {}
                Ok(_) => violations.push(format!("log: entry {index} is not in canonical form")),
                Err(err) => {
                    violations.push(format!("log: entry {index} is not a log entry: {err}"))
                }
            }
            let leaf = merkle::leaf_hash(&e.bytes);
            log.leaves.push(leaf);
            log.range.append(leaf);
        }
        entries = log.range.size();
        for c in &checkpoints {
            if carry.checkpoints.contains_key(&c.size) {
                continue;
            }
            match Checkpoint::verify(&c.note, &jwks, Some(&origin)) {
                Ok(parsed) => match log.root(parsed.size) {
                    Some(root) if root == parsed.root => {
                        roots.insert(parsed.size, root);
                    }
                    Some(_) => violations.push(format!(
                        "log: the checkpoint of size {} has a root the entries do not produce",
                        parsed.size
                    )),
                    None => violations.push(format!(
                        "log: the checkpoint of size {} is beyond the {entries} entries",
                        parsed.size
                    )),
                },
                Err(e) => violations.push(format!("log: checkpoint: {e}")),
            }
        }
    }
    let now: BTreeMap<u64, &str> = checkpoints
        .iter()
        .map(|c| (c.size, c.note.as_str()))
        .collect();
    for (size, note) in &carry.checkpoints {
        match now.get(size) {
            Some(n) if n == note => {}
            Some(_) => violations.push(format!(
                "the checkpoint of size {size} changed across a restart"
            )),
            None => violations.push(format!(
                "the checkpoint of size {size} vanished across a restart"
            )),
        }
    }
    for c in &checkpoints {
        carry.checkpoints.insert(c.size, c.note.clone());
        if c.size <= entries && (full || carry.nodes_checked.insert(c.size)) {
            carry.nodes_checked.insert(c.size);
            let nodes = store.log_nodes(&merkle::root_nodes(c.size)).await?;
            let root = merkle::root(c.size, &mut |id| nodes.get(&id).copied()).ok();
            let expected = roots
                .get(&c.size)
                .copied()
                .or_else(|| carry.log.root(c.size));
            if root.is_none() || root != expected {
                violations.push(format!(
                    "the stored Merkle nodes of size {} do not match the entries",
                    c.size
                ));
            }
        }
    }
    carry.log_entries = entries;
    carry.checkpoint_count = checkpoints.len();
    Ok(violations)
}
