//! After a restart: the log recomputes to every signed checkpoint, the stored Merkle
//! nodes match the entries, and no checkpoint seen before vanished or changed.

use std::collections::BTreeMap;
use std::path::Path;

use countersign_core::logcheck::verify_log;
use countersign_core::merkle;
use countersign_server::KeyRing;
use countersign_store::{Store, StoredEvent};

use super::Carry;
use crate::server;

/// Recomputes the log from its entries against every stored checkpoint, checks the
/// stored tree, and that no checkpoint seen before vanished or changed.
pub(crate) async fn check_log(
    store: &dyn Store,
    data_dir: &Path,
    events: &[StoredEvent],
    carry: &mut Carry,
) -> anyhow::Result<Vec<String>> {
    let mut violations = Vec::new();
    let keys = KeyRing::open_existing(&server::keys_dir(data_dir))?;
    let jwks = countersign_server::keyring::published_jwks(store, &keys).await?;
    let origin = store.log_origin("").await?;
    let checkpoints = store.checkpoints().await?;
    let notes: Vec<String> = checkpoints.iter().map(|c| c.note.clone()).collect();
    let report = verify_log(
        events.iter().map(|e| e.bytes.as_slice()),
        &notes,
        &jwks,
        &origin,
    );
    violations.extend(report.problems.iter().map(|p| format!("log: {p}")));
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
        if c.size <= report.entries && carry.nodes_checked.insert(c.size) {
            let nodes = store.log_nodes(&merkle::root_nodes(c.size)).await?;
            let root = merkle::root(c.size, &mut |id| nodes.get(&id).copied()).ok();
            if root.is_none() || root.as_ref() != report.roots.get(&c.size) {
                violations.push(format!(
                    "the stored Merkle nodes of size {} do not match the entries",
                    c.size
                ));
            }
        }
    }
    carry.log_entries = report.entries;
    carry.checkpoint_count = checkpoints.len();
    Ok(violations)
}
